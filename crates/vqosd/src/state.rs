//! The persisted state: every port and its policy, written atomically after each accepted change
//! and read back at start.
//!
//! Writing: the JSON goes to a temporary file in the same directory, which is fsynced, renamed over
//! the state file, and the directory is fsynced so the rename itself survives a crash. A reader
//! therefore sees either the old state or the new one, never a mix.
//!
//! The temporary file is created with `O_CREAT | O_EXCL | O_NOFOLLOW`: whatever sits at its
//! path (a file left by a crash, or a symlink planted by someone who can write the directory)
//! is unlinked first, never written through, and if something reappears there in between the
//! save fails instead of following it.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vqos_sched::VifPolicy;

use crate::wire::MacAddr;

/// Version of the state file format written by this build.
pub const STATE_VERSION: u32 = 1;

/// Why the state could not be read or written.
#[derive(Debug, Error)]
pub enum StateError {
    /// Reading, writing, syncing or renaming failed.
    #[error("Cannot access state file {path}")]
    Io {
        /// The file or directory concerned.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file is not valid state JSON.
    #[error("State file {path}: {message}")]
    Corrupt {
        /// The state file.
        path: PathBuf,
        /// What the parser said.
        message: String,
    },
    /// A format this build does not know.
    #[error("State file {path}: version {version} is not supported (expected {STATE_VERSION})")]
    Version {
        /// The state file.
        path: PathBuf,
        /// The version found.
        version: u32,
    },
}

/// One port as saved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedPort {
    /// Interface name.
    pub name: String,
    /// Created (`true`) or attached.
    pub create: bool,
    /// MAC allow-list.
    #[serde(default)]
    pub macs: Vec<MacAddr>,
    /// The vif's policy.
    pub policy: VifPolicy,
}

/// The whole persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavedState {
    /// Format version ([`STATE_VERSION`]).
    pub version: u32,
    /// Every port, in switch order.
    pub ports: Vec<SavedPort>,
    /// Ports of the config deleted through the API: not created again at the next start
    /// (until added again through the API). Absent from files without any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub removed: Vec<String>,
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads the state file; `Ok(None)` when it does not exist (first start).
pub fn load(path: &Path) -> Result<Option<SavedState>, StateError> {
    let text = match fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    };
    let state: SavedState = serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(StateError::Version {
            path: path.to_path_buf(),
            version: state.version,
        });
    }
    Ok(Some(state))
}

/// Writes `state` to `path` atomically (temp file, fsync, rename, fsync of the directory).
/// Creates the directory if needed. The file is readable by its owner only.
///
/// Once the rename succeeded the new state is the file's content, so an error of the final
/// fsync of the directory does not make the save fail (the caller must not undo a change that
/// is on disk): it is logged, and only a crash before the kernel writes the directory back could
/// still lose the rename.
pub fn save(path: &Path, state: &SavedState) -> Result<(), StateError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let file_name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        file_name.unwrap_or_else(|| "state".into()),
        std::process::id()
    ));
    let mut json = serde_json::to_vec_pretty(state).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    json.push(b'\n');
    // A stale temp file (or anything else at its path) is unlinked, not opened: unlink does not
    // follow symlinks. A directory there is an error.
    match fs::remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(io_err(&tmp)(e)),
    }
    let mut f = OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .mode(0o600)
        .open(&tmp)
        .map_err(io_err(&tmp))?;
    // From here the file at `tmp` is ours: remove it on failure.
    if let Err(e) = f.write_all(&json).and_then(|_| f.sync_all()) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    drop(f);
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    if let Err(e) = File::open(&dir).and_then(|d| d.sync_all()) {
        eprintln!(
            "vqosd: warning: state saved to {} but the fsync of {} failed: {e}; \
             a crash before the directory is written back may lose this change",
            path.display(),
            dir.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> SavedState {
        SavedState {
            version: STATE_VERSION,
            ports: vec![SavedPort {
                name: "vm1".into(),
                create: false,
                macs: vec!["02:00:00:00:00:01".parse().unwrap()],
                policy: VifPolicy {
                    weight: 3,
                    min_bps: 200_000_000,
                    max_bps: Some(500_000_000),
                    priority: 1,
                },
            }],
            removed: Vec::new(),
        }
    }

    #[test]
    fn save_then_load_round_trips_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert!(load(&path).unwrap().is_none());
        save(&path, &sample()).unwrap();
        let mut second = sample();
        second.ports[0].policy.weight = 9;
        save(&path, &second).unwrap();
        assert_eq!(load(&path).unwrap(), Some(second));
        let names: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["state.json".to_string()]);
    }

    #[test]
    fn corrupt_and_future_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        fs::write(&path, "{not json").unwrap();
        let e = load(&path).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("State file {}", path.display())),
            "{e}"
        );
        fs::write(&path, r#"{"version": 99, "ports": []}"#).unwrap();
        assert!(matches!(
            load(&path),
            Err(StateError::Version { version: 99, .. })
        ));
    }

    #[test]
    fn a_symlink_at_the_temp_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let tmp = dir
            .path()
            .join(format!(".state.json.tmp.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        save(&path, &sample()).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(load(&path).unwrap(), Some(sample()));
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(&tmp).is_err(), "temp file left behind");
        // A stale regular temp file is replaced too.
        fs::write(&tmp, "stale").unwrap();
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path).unwrap(), Some(sample()));
    }

    #[test]
    fn failed_write_keeps_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        save(&path, &sample()).unwrap();
        // A directory in the way of the temp file makes the write fail.
        let tmp = dir
            .path()
            .join(format!(".state.json.tmp.{}", std::process::id()));
        fs::create_dir(&tmp).unwrap();
        fs::write(tmp.join("x"), "x").unwrap();
        let mut changed = sample();
        changed.ports.clear();
        assert!(save(&path, &changed).is_err());
        assert_eq!(load(&path).unwrap(), Some(sample()));
    }
}
