use super::*;

const BASE: &str = r#"
name = "apps"
duration = "20s"
capacity = "500Mbit"
[[vm]]
name = "vm1"
[[vm]]
name = "vm2"
start = "5s"
stop = "15s"
"#;

fn parse(extra: &str) -> Result<Vec<AppSpec>, LabError> {
    let text = format!("{BASE}{extra}");
    let sc = Scenario::parse(&text).expect("scenario");
    parse_apps(&text, &sc)
}

#[test]
fn apps_parse_with_their_defaults() {
    let a = parse(
        "[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\n[[app]]\nvm = \"vm2\"\nkind = \"http\"\npage = 128\n",
    )
    .unwrap();
    assert_eq!(a.len(), 2);
    assert_eq!((a[0].kind, a[0].vm_index), (AppKind::Ftp, 0));
    assert_eq!(
        (a[1].kind, a[1].vm_index, a[1].connections, a[1].page_bytes),
        (AppKind::Http, 1, DEFAULT_CONNECTIONS, 128)
    );
    assert!(parse("").unwrap().is_empty());
}

#[test]
fn bad_apps_are_refused_with_the_reason() {
    for (extra, want) in [
        ("[[app]]\nvm = \"vm9\"\nkind = \"ftp\"\n", "unknown vm"),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"smtp\"\n",
            "expected \"ftp\" or \"http\"",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\npage = 1\n",
            "for kind = \"http\"",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\ndelay_ms = 1\n",
            "for kind = \"http\"",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"http\"\ndelay_ms = 60001\n",
            "at most 60000",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"http\"\nconnections = 0\n",
            "expected 1..=1000",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"http\"\nconnections = 1001\n",
            "expected 1..=1000",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"http\"\nport = 1\n",
            "unknown field",
        ),
        (
            "[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\n[[app]]\nvm = \"vm1\"\nkind = \"http\"\n",
            "already has an app",
        ),
    ] {
        let e = parse(extra).unwrap_err().to_string();
        assert!(e.contains(want), "{extra}: {e}");
    }
    // An app is TCP in the simulator, and its server is in the VM.
    let text = format!("{BASE}[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\n");
    for (from, to, want) in [
        (
            "name = \"vm1\"\n",
            "name = \"vm1\"\ntraffic = \"udp\"\n",
            "must be \"tcp\"",
        ),
        (
            "capacity = \"500Mbit\"\n",
            "capacity = \"500Mbit\"\n[topology]\ndirection = \"download\"\n",
            "upload direction only",
        ),
    ] {
        let t = text.replacen(from, to, 1);
        let sc = Scenario::parse(&t).expect("scenario");
        let e = parse_apps(&t, &sc).unwrap_err().to_string();
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn wrk_reports_parse_in_every_unit() {
    let text = "Running 3s test @ http://10.251.0.1/page
  1 threads and 16 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.12ms  100.74us   3.20s    96.81%
    Req/Sec   122.80k    15.07k  138.69k    77.42%
  Latency Distribution
     50%  102.00us
     75%    1.16ms
     90%    2.00s
     99%    1.50m
  377860 requests in 3.10s, 131.89MB read
  Socket errors: connect 1, read 2, write 0, timeout 4
  Non-2xx or 3xx responses: 5
Requests/sec: 121893.59
Transfer/sec:     42.55MB
";
    let s = parse_wrk(text).unwrap();
    assert_eq!(s.requests, 377_860);
    assert!((s.requests_per_s - 121_893.59).abs() < 1e-6);
    assert!((s.mean_us - 1120.0).abs() < 1e-9);
    assert_eq!(s.errors, 12);
    let want = [(50.0, 102.0), (75.0, 1160.0), (90.0, 2e6), (99.0, 90e6)];
    assert_eq!(s.percentiles_us.len(), 4);
    for ((p, v), (wp, wv)) in s.percentiles_us.iter().zip(want) {
        assert_eq!(*p, wp);
        assert!((v - wv).abs() < 1e-6, "{p}: {v}");
    }
    assert!(parse_wrk("unable to connect to 10.0.0.1:80 Connection refused\n").is_err());
}

#[test]
fn clients_run_for_the_vms_active_time() {
    let a = parse("[[app]]\nvm = \"vm2\"\nkind = \"http\"\nconnections = 8\n").unwrap();
    let d = Path::new("/x");
    let args = client_args(&a[0], "10.0.0.2", 10.0, d).join(" ");
    assert_eq!(args, "wrk -t1 -c8 -d10s --latency http://10.0.0.2/page");
    let a = parse("[[app]]\nvm = \"vm2\"\nkind = \"http\"\ndelay_ms = 2\n").unwrap();
    assert_eq!(a[0].delay_ms, 2);
    let args = client_args(&a[0], "10.0.0.2", 10.0, d).join(" ");
    assert_eq!(
        args,
        "wrk -t1 -c16 -d10s --latency -s /x/vm2-http/delay.lua http://10.0.0.2/page"
    );
    assert!(wrk_script(2).contains("function delay()\n  return 2\nend"));
    let f = parse("[[app]]\nvm = \"vm1\"\nkind = \"ftp\"\n").unwrap();
    let args = client_args(&f[0], "10.0.0.1", 20.0, d).join(" ");
    assert!(
        args.starts_with("curl -sS -o /dev/null --max-time 20.0")
            && args.ends_with("ftp://10.0.0.1/file"),
        "{args}"
    );
}

#[test]
fn server_configs_listen_on_the_vms_address_only() {
    let v = vsftpd_conf("10.9.0.1", Path::new("/r"), Path::new("/e"));
    assert!(v.contains("listen_address=10.9.0.1\n") && v.contains("anon_root=/r\n"));
    assert!(v.contains("write_enable=NO\n") && v.contains("background=NO\n"));
    let n = nginx_conf("10.9.0.1", Path::new("/d"), Path::new("/l/e.log"));
    assert!(n.contains("listen 10.9.0.1:80;") && n.contains("daemon off;"));
    assert!(n.contains("root /d/www;") && n.contains("pid /d/nginx.pid;"));
    assert!(n.contains("error_log /l/e.log warn;"), "{n}");
}

#[test]
fn results_read_each_clients_log() {
    let dir = tempfile::tempdir().unwrap();
    let ftp = dir.path().join("ftp.log");
    std::fs::write(&ftp, "1367343104 455781946 28\n").unwrap();
    let bad = dir.path().join("http.log");
    std::fs::write(
        &bad,
        "unable to connect to 10.0.0.2:80 Connection refused\n",
    )
    .unwrap();
    let refused = dir.path().join("ftp2.log");
    let curl_err = "curl: (7) Failed to connect to 10.0.0.3 port 21: Connection refused\n0 0 7\n";
    std::fs::write(&refused, curl_err).unwrap();
    let r = results(&[
        ("vm1".into(), AppKind::Ftp, 0.0, ftp),
        ("vm2".into(), AppKind::Http, 5.0, bad),
        ("vm3".into(), AppKind::Ftp, 0.0, refused),
    ]);
    assert_eq!(r[0].bytes, Some(1_367_343_104));
    assert!((r[0].mbit_s.unwrap() - 3646.26).abs() < 0.01);
    assert!(r[1].http.is_none());
    assert!(
        r[1].error.as_ref().unwrap().contains("Connection refused"),
        "{:?}",
        r[1]
    );
    // A refused download is an error, not 0 bytes at 0 Mbit/s.
    assert!(r[2].bytes.is_none(), "{:?}", r[2]);
    let e = r[2].error.as_ref().unwrap();
    assert!(
        e.contains("curl exit 7 after 0 bytes") && e.contains("port 21"),
        "{e}"
    );
    let t = report_table(&r);
    assert!(t.contains("| vm1 | ftp | 0.0 | 3646.3 |"), "{t}");
    assert!(t.contains("vm2: no wrk summary"), "{t}");
    assert!(report_table(&[]).is_empty());
}

#[test]
fn curl_ends_by_its_time_limit_or_is_an_error() {
    assert_eq!(parse_curl("1000 125000 0\n").unwrap(), (1000, 1.0));
    assert_eq!(parse_curl("2000 250000 28\n").unwrap(), (2000, 2.0));
    // Ended early with data: an error all the same (the server went away).
    let e = parse_curl("curl: (56) Recv failure\n500 100 56\n").unwrap_err();
    assert!(e.contains("exit 56") && e.contains("Recv failure"), "{e}");
    assert!(parse_curl("0 0 28\n")
        .unwrap_err()
        .contains("after 0 bytes"));
    assert!(parse_curl("").is_err() && parse_curl("1 2\n").is_err());
}
