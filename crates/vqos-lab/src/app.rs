//! Applications in the VMs: `[[app]]` tables of a scenario, run by the lab (C2QoS Fig. 6(f)-(g):
//! FTP servers beside nginx servers under a pressure test).
//!
//! ```toml
//! [[app]]
//! vm = "vm1"            # the VM the server runs in (required); its [[vm]] traffic is "tcp"
//! kind = "ftp"          # vsftpd in the VM; curl in the sink downloads a file for the VM's active time
//! [[app]]
//! vm = "vm3"
//! kind = "http"         # nginx in the VM; wrk in the sink for the VM's active time
//! connections = 16      # wrk's open connections (http only; default 16)
//! page = 128            # bytes of the page wrk fetches (http only; default 612, nginx's welcome page)
//! delay_ms = 1          # each connection waits this long after an answer (http only; default 0)
//! ```
//!
//! ## Behavior
//! - The servers run for the whole run in their VMs' namespaces, each with a config of its own
//!   in a scratch directory under the system's temporary directory, removed with the run
//!   (vsftpd: anonymous, read-only, one sparse 1 TiB file, so that no transfer ends within a
//!   run; nginx: one worker, no access log, keep-alive); their logs go to the run's
//!   `logs/apps/`. Every path they are given is absolute and every file they serve is
//!   world-readable: nginx's workers run as `nobody` and vsftpd serves as `ftp`. The lab starts
//!   them (and stops each with its process group: nginx's workers too); the packages' own
//!   services are never used. A server that exits within 300 ms of its start fails the run
//!   with its log's last lines.
//! - A VM with an app sends no generated traffic: where the lab would start its iperf3 client
//!   (at the VM's `start`, and again when an event changes its load) it starts the app's
//!   client in the sink instead, for the rest of the VM's active time: `curl` fetching the file
//!   over FTP (passive mode), or `wrk -t1 -c<connections> --latency` on the page. The rates of
//!   the report are counted at the VMs' interfaces as for every VM.
//! - `delay_ms` bounds the request rate: each connection then waits that long after an answer
//!   before its next request (a wrk script's `delay()`), so a VM gets at most
//!   `connections / (delay + RTT)` requests a second. wrk is a closed loop: without a delay it
//!   asks as fast as answers come, so it measures what the VM's share allows rather than the
//!   latency the switch adds at a given load (wrk2's fixed rate is not packaged in Debian).
//! - The simulator has no applications: it models the VM by its `[[vm]]` traffic (greedy TCP up
//!   to its max, which is what an FTP transfer is; a pressure test on a small page is many
//!   small frames, which the `[[vm]]`'s `packet_size` should say).
//! - Results: `apps` in `results.json` (per client, bytes and Mbit/s for FTP; requests/s,
//!   errors and the latency distribution wrk reports, mean, p50, p75, p90, p99 in µs, for HTTP)
//!   and a table in `report.md` (the same without p75). A curl that ended other than by its
//!   time limit, or fetched nothing, and a wrk without a summary are an app's `error`.
//! - An `[[event]]` on an app's VM changes its policy only: the client runs on.
//!
//! ## Limitations
//! - Upload direction only (the servers are in the VMs); a `download` scenario with an app is
//!   refused.
//! - wrk measures a closed loop: each connection waits for its answer before the next request,
//!   so a slower switch lowers the request rate as well as raising the latency.
//! - Needs vsftpd, nginx, wrk and curl (`scripts/deps.sh test` installs them as root).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vqos_sim::scenario::Traffic;
use vqos_sim::Scenario;

use crate::paper::write;
use crate::sys::{self, Cleanup};
use crate::LabError;

/// The size of the file the FTP servers serve: sparse, and large enough that no transfer of
/// a run ends (1 TiB at 10 Gbit/s is 15 minutes).
pub const FTP_FILE_BYTES: u64 = 1 << 40;

/// nginx's welcome page, the default page size of an HTTP app.
pub const DEFAULT_PAGE_BYTES: usize = 612;

/// wrk's default connections.
pub const DEFAULT_CONNECTIONS: u32 = 16;

/// Most wrk connections: one nginx worker holds them within the usual 1024 open files.
pub const MAX_CONNECTIONS: u32 = 1000;

/// How long a server must stay up after its start to count as started.
const SERVER_START: std::time::Duration = std::time::Duration::from_millis(300);

#[derive(Debug, Deserialize)]
struct RawFile {
    #[serde(default)]
    app: Vec<RawApp>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawApp {
    vm: String,
    kind: String,
    connections: Option<u32>,
    page: Option<usize>,
    delay_ms: Option<u32>,
}

/// What an app is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AppKind {
    /// vsftpd in the VM, a curl download from the sink.
    Ftp,
    /// nginx in the VM, wrk from the sink.
    Http,
}

/// One `[[app]]` of the scenario.
#[derive(Debug, Clone, PartialEq)]
pub struct AppSpec {
    /// The VM's name.
    pub vm: String,
    /// Its index in the scenario's VMs.
    pub vm_index: usize,
    /// The application.
    pub kind: AppKind,
    /// wrk's connections (HTTP).
    pub connections: u32,
    /// The page's bytes (HTTP).
    pub page_bytes: usize,
    /// What each connection waits after an answer, ms (HTTP; 0 = nothing).
    pub delay_ms: u32,
}

fn invalid(msg: String) -> LabError {
    LabError::Invalid(msg)
}

/// The `[[app]]` tables of a scenario file's text, checked against the parsed scenario.
pub fn parse_apps(text: &str, sc: &Scenario) -> Result<Vec<AppSpec>, LabError> {
    let raw: RawFile = toml::from_str(text).map_err(|e| invalid(format!("[[app]]: {e}")))?;
    let mut out: Vec<AppSpec> = Vec::new();
    for (k, a) in raw.app.into_iter().enumerate() {
        let what = format!("app {} ({})", k + 1, a.vm);
        let vm_index = sc
            .vms
            .iter()
            .position(|v| v.name == a.vm)
            .ok_or_else(|| invalid(format!("{what}: unknown vm '{}'", a.vm)))?;
        if out.iter().any(|o| o.vm_index == vm_index) {
            return Err(invalid(format!("{what}: the VM already has an app")));
        }
        if sc.is_download(vm_index) {
            return Err(invalid(format!(
                "{what}: apps run in the upload direction only (the server is in the VM)"
            )));
        }
        if sc.vms[vm_index].initial.traffic != Traffic::Tcp {
            return Err(invalid(format!(
                "{what}: the VM's traffic must be \"tcp\": the simulator models an app as TCP"
            )));
        }
        let kind = match a.kind.as_str() {
            "ftp" => AppKind::Ftp,
            "http" => AppKind::Http,
            other => {
                return Err(invalid(format!(
                    "{what}: kind '{other}': expected \"ftp\" or \"http\""
                )))
            }
        };
        if kind == AppKind::Ftp
            && (a.connections.is_some() || a.page.is_some() || a.delay_ms.is_some())
        {
            return Err(invalid(format!(
                "{what}: connections, page and delay_ms are for kind = \"http\""
            )));
        }
        let delay_ms = a.delay_ms.unwrap_or(0);
        if delay_ms > 60_000 {
            return Err(invalid(format!(
                "{what}: delay_ms {delay_ms}: expected at most 60000"
            )));
        }
        let connections = a.connections.unwrap_or(DEFAULT_CONNECTIONS);
        if !(1..=MAX_CONNECTIONS).contains(&connections) {
            return Err(invalid(format!(
                "{what}: connections {connections}: expected 1..={MAX_CONNECTIONS}"
            )));
        }
        let page_bytes = a.page.unwrap_or(DEFAULT_PAGE_BYTES);
        if page_bytes > 1 << 24 {
            return Err(invalid(format!(
                "{what}: page {page_bytes}: expected at most 16 MiB"
            )));
        }
        out.push(AppSpec {
            vm: a.vm,
            vm_index,
            kind,
            connections,
            page_bytes,
            delay_ms,
        });
    }
    Ok(out)
}

/// Where program `prog` is: the `PATH`, then the sbin directories (root's servers).
pub fn find_tool(prog: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(prog))
        .find(|p| p.is_file())
}

/// The programs the apps need, each found ([`find_tool`]), or the package that has it.
pub fn check_tools(specs: &[AppSpec]) -> Result<(), LabError> {
    let mut need: Vec<(&str, &str)> = Vec::new();
    if specs.iter().any(|s| s.kind == AppKind::Ftp) {
        need.extend([("vsftpd", "vsftpd"), ("curl", "curl")]);
    }
    if specs.iter().any(|s| s.kind == AppKind::Http) {
        need.extend([("nginx", "nginx-light"), ("wrk", "wrk")]);
    }
    for (prog, pkg) in need {
        if find_tool(prog).is_none() {
            return Err(LabError::MissingTool(format!(
                "{prog} for [[app]] (apt-get install -y {pkg}, or scripts/deps.sh test)"
            )));
        }
    }
    Ok(())
}

fn tool(prog: &str) -> Result<String, LabError> {
    find_tool(prog)
        .map(|p| p.display().to_string())
        .ok_or_else(|| LabError::MissingTool(format!("{prog} for [[app]]")))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> LabError + '_ {
    move |source| LabError::Io {
        what: path.display().to_string(),
        source,
    }
}

/// Writes a file the servers' unprivileged users read (0644 whatever the umask).
fn write_readable(path: &Path, text: &str) -> Result<(), LabError> {
    use std::os::unix::fs::PermissionsExt;
    write(path, text)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).map_err(io(path))
}

fn mkdir(path: &Path) -> Result<(), LabError> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(path).map_err(io(path))?;
    // The servers' unprivileged users (vsftpd's `ftp`, nginx's `nobody`) read what is in it.
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).map_err(io(path))
}

/// vsftpd's config: anonymous, read-only, passive mode, in the foreground.
pub fn vsftpd_conf(ip: &str, root: &Path, empty: &Path) -> String {
    format!(
        "listen=YES\nlisten_ipv6=NO\nlisten_address={ip}\nlisten_port=21\nbackground=NO\n\
         anonymous_enable=YES\nno_anon_password=YES\nanon_root={}\nftp_username=ftp\n\
         local_enable=NO\nwrite_enable=NO\npasv_enable=YES\npasv_min_port=40000\n\
         pasv_max_port=40999\nsecure_chroot_dir={}\nseccomp_sandbox=NO\nxferlog_enable=NO\n",
        root.display(),
        empty.display()
    )
}

/// nginx's config: one worker, in the foreground, every path under `dir` but the error log
/// (`error_log`); both absolute (nginx reads relative paths against its own prefix).
pub fn nginx_conf(ip: &str, dir: &Path, error_log: &Path) -> String {
    let (d, e) = (dir.display(), error_log.display());
    format!(
        "daemon off;\nworker_processes 1;\npid {d}/nginx.pid;\nerror_log {e} warn;\n\
         events {{ worker_connections 4096; }}\nhttp {{\n  access_log off;\n\
         client_body_temp_path {d}/tmp-body;\n  proxy_temp_path {d}/tmp-proxy;\n\
         fastcgi_temp_path {d}/tmp-fastcgi;\n  uwsgi_temp_path {d}/tmp-uwsgi;\n\
         scgi_temp_path {d}/tmp-scgi;\n  server {{ listen {ip}:80; root {d}/www; \
         keepalive_requests 100000000; }}\n}}\n"
    )
}

/// Starts each app's server in its VM's namespace (`vm_ns[i]`, `vm_ip[i]`): configs and
/// served files under `scratch` (an absolute directory the caller removes), logs under
/// `logs`. The processes are the run's services, each stopped with its process group.
pub fn start_servers(
    specs: &[AppSpec],
    (vm_ns, vm_ip): (&[String], &[String]),
    scratch: &Path,
    logs: &Path,
    cleanup: &mut Cleanup,
) -> Result<(), LabError> {
    if specs.is_empty() {
        return Ok(());
    }
    let logs = std::path::absolute(logs).map_err(io(logs))?;
    mkdir(&logs)?;
    let mut started = Vec::new();
    for s in specs {
        let (ns, ip) = (&vm_ns[s.vm_index], &vm_ip[s.vm_index]);
        let d = app_dir(scratch, s);
        mkdir(&d)?;
        let log = logs.join(format!("{}-{}.log", s.vm, kind_name(s.kind)));
        let p = match s.kind {
            AppKind::Ftp => {
                let (root, empty) = (d.join("root"), d.join("empty"));
                mkdir(&root)?;
                mkdir(&empty)?;
                let file = root.join("file");
                write_readable(&file, "")?;
                std::fs::OpenOptions::new()
                    .write(true)
                    .open(&file)
                    .and_then(|f| f.set_len(FTP_FILE_BYTES))
                    .map_err(io(&file))?;
                let conf = d.join("vsftpd.conf");
                write_readable(&conf, &vsftpd_conf(ip, &root, &empty))?;
                let conf = conf.display().to_string();
                let bin = tool("vsftpd")?;
                sys::spawn(
                    &format!("vsftpd {}", s.vm),
                    Some(ns),
                    &[&bin, &conf],
                    Some(&log),
                )?
            }
            AppKind::Http => {
                mkdir(&d.join("www"))?;
                write_readable(&d.join("www/page"), &"a".repeat(s.page_bytes))?;
                write_readable(&d.join("delay.lua"), &wrk_script(s.delay_ms))?;
                let conf = d.join("nginx.conf");
                let err = logs.join(format!("{}-nginx-error.log", s.vm));
                write_readable(&conf, &nginx_conf(ip, &d, &err))?;
                let (conf, err) = (conf.display().to_string(), err.display().to_string());
                let bin = tool("nginx")?;
                let args = [bin.as_str(), "-c", &conf, "-e", &err];
                sys::spawn(&format!("nginx {}", s.vm), Some(ns), &args, Some(&log))?
            }
        };
        cleanup.services.push(p.stop_group());
        started.push((cleanup.services.len() - 1, log));
    }
    std::thread::sleep(SERVER_START);
    for (k, log) in started {
        if cleanup.services[k].exited() {
            let label = cleanup.services[k].label.clone();
            return Err(LabError::Setup(format!(
                "{label} exited at its start: {}",
                last_lines(&log, 3)
            )));
        }
    }
    Ok(())
}

/// The last `n` non-empty lines of a file, on one line (for an error message).
fn last_lines(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match lines.len() {
        0 => format!("{} is empty", path.display()),
        k => lines[k.saturating_sub(n)..].join(" | "),
    }
}

fn kind_name(k: AppKind) -> &'static str {
    match k {
        AppKind::Ftp => "ftp",
        AppKind::Http => "http",
    }
}

/// The wrk script that makes each connection wait `delay_ms` after an answer.
pub fn wrk_script(delay_ms: u32) -> String {
    format!("-- written by vqos lab: each connection waits after an answer\nfunction delay()\n  return {delay_ms}\nend\n")
}

/// Where [`start_servers`] put an app's files under `dir`.
pub fn app_dir(dir: &Path, spec: &AppSpec) -> PathBuf {
    dir.join(format!("{}-{}", spec.vm, kind_name(spec.kind)))
}

/// The client's command line for `secs` seconds against the server at `ip`; `dir` is where
/// [`start_servers`] wrote the app's files.
pub fn client_args(spec: &AppSpec, ip: &str, secs: f64, dir: &Path) -> Vec<String> {
    match spec.kind {
        AppKind::Ftp => vec![
            "curl".into(),
            "-sS".into(),
            "-o".into(),
            "/dev/null".into(),
            "--max-time".into(),
            format!("{:.1}", secs.max(1.0)),
            "-w".into(),
            "%{size_download} %{speed_download} %{exitcode}\\n".into(),
            format!("ftp://{ip}/file"),
        ],
        AppKind::Http => {
            let mut a = vec![
                "wrk".into(),
                "-t1".into(),
                format!("-c{}", spec.connections),
                format!("-d{}s", secs.max(1.0).round() as u64),
                "--latency".into(),
            ];
            if spec.delay_ms > 0 {
                let script = app_dir(dir, spec).join("delay.lua");
                a.extend(["-s".into(), script.display().to_string()]);
            }
            a.push(format!("http://{ip}/page"));
            a
        }
    }
}

mod results;
pub use results::{parse_curl, parse_wrk, report_table, results, AppLog, AppResult, WrkSummary};

#[cfg(test)]
mod tests;
