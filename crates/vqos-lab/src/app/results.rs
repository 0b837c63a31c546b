//! What the apps' clients printed: wrk's summary and curl's line, read into [`AppResult`]s,
//! and the report's table of them.

use std::path::PathBuf;

use serde::Serialize;

use super::{kind_name, last_lines, AppKind};

/// What wrk printed at the end of a run.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct WrkSummary {
    /// Requests completed.
    pub requests: u64,
    /// Requests per second.
    pub requests_per_s: f64,
    /// Socket errors and non-2xx responses.
    pub errors: u64,
    /// Mean latency, µs.
    pub mean_us: f64,
    /// The latency distribution: (percentile, µs), as wrk prints it (50, 75, 90, 99).
    pub percentiles_us: Vec<(f64, f64)>,
}

fn duration_us(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, mult) = if let Some(v) = s.strip_suffix("us") {
        (v, 1.0)
    } else if let Some(v) = s.strip_suffix("ms") {
        (v, 1e3)
    } else if let Some(v) = s.strip_suffix('m') {
        (v, 60e6)
    } else if let Some(v) = s.strip_suffix('s') {
        (v, 1e6)
    } else {
        return None;
    };
    num.trim().parse::<f64>().ok().map(|n| n * mult)
}

/// Parses wrk's `--latency` report.
pub fn parse_wrk(text: &str) -> Result<WrkSummary, String> {
    let mut out = WrkSummary::default();
    let mut in_dist = false;
    let mut have_rate = false;
    for line in text.lines() {
        let t = line.trim();
        let words: Vec<&str> = t.split_whitespace().collect();
        if t.starts_with("Latency Distribution") {
            in_dist = true;
            continue;
        }
        if in_dist {
            if let [p, v] = words[..] {
                if let (Some(p), Some(v)) = (p.strip_suffix('%'), duration_us(v)) {
                    if let Ok(p) = p.parse::<f64>() {
                        out.percentiles_us.push((p, v));
                        continue;
                    }
                }
            }
            in_dist = false;
        }
        match words[..] {
            ["Latency", mean, ..] => {
                out.mean_us = duration_us(mean).ok_or_else(|| format!("latency '{mean}'"))?;
            }
            [n, "requests", "in", ..] => {
                out.requests = n.parse().map_err(|_| format!("requests '{n}'"))?;
            }
            ["Requests/sec:", r] => {
                out.requests_per_s = r.parse().map_err(|_| format!("requests/s '{r}'"))?;
                have_rate = true;
            }
            ["Socket", "errors:", ..] => {
                // "Socket errors: connect 0, read 0, write 0, timeout 0"
                out.errors += words
                    .iter()
                    .filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok())
                    .sum::<u64>();
            }
            ["Non-2xx", "or", "3xx", "responses:", n] => {
                out.errors += n.parse::<u64>().unwrap_or(0);
            }
            _ => {}
        }
    }
    if !have_rate || out.percentiles_us.is_empty() {
        return Err("no wrk summary (Requests/sec and the latency distribution)".into());
    }
    Ok(out)
}

/// One app client's result.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AppResult {
    /// The VM whose server it loaded.
    pub vm: String,
    /// The application.
    pub kind: AppKind,
    /// When the client started, s into the run.
    pub from_s: f64,
    /// FTP: bytes downloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bytes: Option<u64>,
    /// FTP: the transfer's mean rate, Mbit/s (curl's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mbit_s: Option<f64>,
    /// HTTP: wrk's summary.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub http: Option<WrkSummary>,
    /// Why there is no result.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// What curl printed (`-w "%{size_download} %{speed_download} %{exitcode}"`, after its own
/// error lines): bytes and Mbit/s, or why the download failed. Exit 28 is its time limit, the
/// way every download of a run ends.
pub fn parse_curl(text: &str) -> Result<(u64, f64), String> {
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    let w: Vec<&str> = last.split_whitespace().collect();
    let (Some(bytes), Some(speed), Some(code)) = (
        w.first().and_then(|b| b.parse::<u64>().ok()),
        w.get(1).and_then(|s| s.parse::<f64>().ok()),
        w.get(2).and_then(|c| c.parse::<u32>().ok()),
    ) else {
        return Err(format!("curl printed {:?}", text.trim()));
    };
    if !(code == 0 || code == 28) || bytes == 0 {
        let why = text
            .lines()
            .find(|l| l.starts_with("curl:"))
            .unwrap_or(last);
        return Err(format!("curl exit {code} after {bytes} bytes: {why}"));
    }
    Ok((bytes, speed * 8.0 / 1e6))
}

/// An app client of the run: its VM, kind, when it started (s) and its log.
pub type AppLog = (String, AppKind, f64, PathBuf);

/// Reads the clients' logs.
pub fn results(logs: &[AppLog]) -> Vec<AppResult> {
    logs.iter()
        .map(|(vm, kind, from_s, log)| {
            let mut r = AppResult {
                vm: vm.clone(),
                kind: *kind,
                from_s: *from_s,
                bytes: None,
                mbit_s: None,
                http: None,
                error: None,
            };
            let text = std::fs::read_to_string(log).unwrap_or_default();
            match kind {
                AppKind::Ftp => match parse_curl(&text) {
                    Ok((bytes, mbit_s)) => {
                        r.bytes = Some(bytes);
                        r.mbit_s = Some(mbit_s);
                    }
                    Err(e) => r.error = Some(e),
                },
                AppKind::Http => match parse_wrk(&text) {
                    Ok(s) => r.http = Some(s),
                    Err(e) => r.error = Some(format!("{e}: {}", last_lines(log, 1))),
                },
            }
            r
        })
        .collect()
}

/// The report's table of the apps' results (markdown), empty without apps.
pub fn report_table(results: &[AppResult]) -> String {
    if results.is_empty() {
        return String::new();
    }
    let mut s = String::from(
        "\n## Applications\n\n| vm | app | from s | Mbit/s | requests/s | errors | mean µs | \
         p50 µs | p90 µs | p99 µs |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for r in results {
        let pct = |p: f64| {
            r.http
                .as_ref()
                .and_then(|h| h.percentiles_us.iter().find(|x| x.0 == p))
                .map_or("–".to_string(), |x| format!("{:.0}", x.1))
        };
        let h = r.http.as_ref();
        s += &format!(
            "| {} | {} | {:.1} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.vm,
            kind_name(r.kind),
            r.from_s,
            r.mbit_s.map_or("–".into(), |m| format!("{m:.1}")),
            h.map_or("–".into(), |h| format!("{:.0}", h.requests_per_s)),
            h.map_or("–".into(), |h| h.errors.to_string()),
            h.map_or("–".into(), |h| format!("{:.0}", h.mean_us)),
            pct(50.0),
            pct(90.0),
            pct(99.0),
        );
        if let Some(e) = &r.error {
            s += &format!("\n{}: {e}\n", r.vm);
        }
    }
    s
}
