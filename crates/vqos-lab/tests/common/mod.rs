//! What the lab's end-to-end tests share: whether this machine can run them, and what a run
//! left behind.

pub fn can_run(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        println!("SKIP {test}: needs root");
        return false;
    }
    let ok = std::process::Command::new("iperf3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        println!("SKIP {test}: iperf3 not installed (apt-get install -y iperf3)");
        return false;
    }
    true
}

/// Everything of this process's runs is named `vl<pid>...`.
pub fn prefix() -> String {
    format!("vl{}", std::process::id() % 100_000)
}

/// Namespaces, links and processes left by this process's lab runs.
pub fn leftovers() -> Vec<String> {
    let p = prefix();
    let mut left = Vec::new();
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    for l in String::from_utf8_lossy(&ns.stdout).lines() {
        if l.starts_with(&p) {
            left.push(format!("namespace {l}"));
        }
    }
    let links = std::process::Command::new("ip")
        .args(["-o", "link"])
        .output()
        .unwrap();
    for l in String::from_utf8_lossy(&links.stdout).lines() {
        if l.contains(&p) {
            left.push(format!("link {l}"));
        }
    }
    // The VMs' CPU limits (`cpu`): cgroups named `vqos-lab-<prefix>-<vm>`.
    for root in ["/sys/fs/cgroup/cpu", "/sys/fs/cgroup"] {
        for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with(&format!("vqos-lab-{p}")) {
                left.push(format!("cgroup {root}/{name}"));
            }
        }
    }
    let me = std::process::id().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !pid.chars().all(|c| c.is_ascii_digit()) || pid == me {
            continue;
        }
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let ppid = stat
            .rsplit(')')
            .next()
            .and_then(|r| r.split_whitespace().nth(1))
            .unwrap_or("");
        if cmd.contains(&p) || (ppid == me && !stat.contains(") Z")) {
            left.push(format!("process {pid}: {cmd}"));
        }
    }
    left
}
