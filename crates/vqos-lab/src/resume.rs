//! `--resume`: a long `vqos lab paper` run (`all --runs 3` is about four hours) continued in
//! the same output directory after an interrupt, keeping the runs that finished.
//!
//! ## Behavior
//! - The first invocation into a directory writes `run-info.json`: the commit, the duration
//!   scale, the runs per cell, and when it started. A run without `--resume` starts afresh
//!   (and rewrites it).
//! - `--resume` refuses a directory whose `run-info.json` names another commit, duration scale
//!   or number of runs (mixing them would put two builds or two lengths in one table), and a
//!   directory that has none.
//! - A scenario run is kept when its directory holds a `results.json` with the same duration
//!   scale (a run that was interrupted or failed wrote none, or wrote it elsewhere); a sweep
//!   when its `summary.md` and its CSV are there. Anything else runs again, including the real
//!   load (one run of a few minutes).
//! - The summary's header gives the first start's date and how many runs were kept.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::LabError;

/// What a directory's runs were made with (`run-info.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Short git commit of the build (`unknown` outside a repository).
    pub commit: String,
    /// The scenarios' duration scale.
    pub duration_scale: f64,
    /// Lab runs per scenario file and switch.
    pub repeats: u32,
    /// When the first invocation started, `YYYY-MM-DD HH:MM UTC`.
    pub started: String,
}

const FILE: &str = "run-info.json";

/// Starts or resumes the run into `out`: returns the run's info, whose `started` is the first
/// invocation's when resuming.
pub fn begin(out: &Path, now: RunInfo, resume: bool) -> Result<RunInfo, LabError> {
    let path = out.join(FILE);
    if !resume {
        let text = serde_json::to_string_pretty(&now).unwrap_or_default() + "\n";
        crate::paper::write(&path, &text)?;
        return Ok(now);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| {
        LabError::Invalid(format!(
            "--resume: {} has no run to resume ({}: {e}); run without --resume to start one",
            out.display(),
            path.display()
        ))
    })?;
    let was: RunInfo = serde_json::from_str(&text)
        .map_err(|e| LabError::Invalid(format!("--resume: {}: {e}", path.display())))?;
    let differs = |what: &str, then: String, here: String| {
        LabError::Invalid(format!(
            "--resume: {} was started with {what} {then}, this invocation has {here}; resume \
             with the same {what}, or start a new directory",
            out.display()
        ))
    };
    if was.commit != now.commit {
        return Err(differs("commit", was.commit, now.commit));
    }
    if was.duration_scale != now.duration_scale {
        let (a, b) = (was.duration_scale, now.duration_scale);
        return Err(differs("duration scale", a.to_string(), b.to_string()));
    }
    if was.repeats != now.repeats {
        let (a, b) = (was.repeats, now.repeats);
        return Err(differs("--runs", a.to_string(), b.to_string()));
    }
    Ok(was)
}

/// The `results.json` of a finished run in `dir` made at `duration_scale`, if there is one.
pub fn kept_result(dir: &Path, duration_scale: f64) -> Option<serde_json::Value> {
    let text = std::fs::read_to_string(dir.join("results.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&text).ok()?;
    let scale = v.get("duration_scale")?.as_f64()?;
    (scale == duration_scale && v.get("checks").is_some()).then_some(v)
}

/// A finished sweep's `summary.md` in `dir` (with its CSV `csv`), if there is one.
pub fn kept_sweep(dir: &Path, csv: &str) -> Option<String> {
    if !dir.join(csv).is_file() {
        return None;
    }
    std::fs::read_to_string(dir.join("summary.md")).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(commit: &str, scale: f64, repeats: u32, started: &str) -> RunInfo {
        RunInfo {
            commit: commit.into(),
            duration_scale: scale,
            repeats,
            started: started.into(),
        }
    }

    fn tmp(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("vqos-resume-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_resume_keeps_the_first_start_and_refuses_another_build_or_length() {
        let d = tmp("begin");
        let e = begin(&d, info("abc", 1.0, 3, "then"), true).unwrap_err();
        assert!(e.to_string().contains("no run to resume"), "{e}");
        begin(&d, info("abc", 1.0, 3, "then"), false).unwrap();
        let r = begin(&d, info("abc", 1.0, 3, "now"), true).unwrap();
        assert_eq!(r.started, "then");
        for (other, what) in [
            (info("def", 1.0, 3, "now"), "commit abc"),
            (info("abc", 0.5, 3, "now"), "duration scale 1"),
            (info("abc", 1.0, 1, "now"), "--runs 3"),
        ] {
            let e = begin(&d, other, true).unwrap_err().to_string();
            assert!(e.contains(what), "{e}");
        }
        // Without --resume the directory starts afresh.
        let r = begin(&d, info("def", 1.0, 1, "now"), false).unwrap();
        assert_eq!(r.started, "now");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn only_a_finished_run_at_the_same_scale_is_kept() {
        let d = tmp("kept");
        assert!(kept_result(&d, 1.0).is_none(), "no results.json");
        std::fs::write(d.join("results.json"), "{\"duration_scale\": 1.0").unwrap();
        assert!(kept_result(&d, 1.0).is_none(), "a torn file");
        let done = r#"{"duration_scale": 1.0, "checks": []}"#;
        std::fs::write(d.join("results.json"), done).unwrap();
        assert!(kept_result(&d, 1.0).is_some());
        assert!(kept_result(&d, 0.5).is_none(), "another length");
        assert!(kept_sweep(&d, "cpu.csv").is_none());
        std::fs::write(d.join("cpu.csv"), "vms\n").unwrap();
        assert!(kept_sweep(&d, "cpu.csv").is_none(), "no summary yet");
        std::fs::write(d.join("summary.md"), "# s\n").unwrap();
        assert_eq!(kept_sweep(&d, "cpu.csv").as_deref(), Some("# s\n"));
        let _ = std::fs::remove_dir_all(&d);
    }
}
