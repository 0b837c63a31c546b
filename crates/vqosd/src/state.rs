//! The persisted state: every port and its policy, written atomically after each accepted change
//! and read back at start.
//!
//! Writing: the JSON goes to a temporary file in the same directory, which is fsynced, renamed over
//! the state file, and the directory is fsynced so the rename itself survives a crash. A reader
//! therefore sees either the old state or the new one, never a mix.
//!
//! The temporary file has one fixed name, `.<state>.tmp` next to the state file, so a daemon
//! killed mid-save (kill -9, power loss) leaves at most that one file, removed by the next save
//! and by the next start ([`restore`], which also removes the `.<state>.tmp.<pid>` files older
//! builds left). It is created with `O_CREAT | O_EXCL | O_NOFOLLOW`: whatever sits at its path
//! (a file left by a crash, or a symlink planted by someone who can write the directory) is
//! unlinked first, never written through, and if something reappears there in between the save
//! fails instead of following it.
//!
//! After each save the same content is written, the same way, to `<state>.last-good`
//! ([`last_good_path`]). At start ([`restore`]) a state file that does not parse or does not
//! pass validation is set aside as `<state>.corrupt` and the last-good copy is used instead,
//! with a loud warning; a missing state file with a last-good copy beside it is restored from
//! the copy too (delete both to start afresh). Without a usable copy the start fails.
//!
//! A symlink at the state file's path is refused at start with a clear error: the state is
//! replaced by rename, which would replace the link itself with a regular file, and a dangling
//! link would read as "no state" and silently reset every policy made through the API. Point
//! `state_file` at the real path instead.
//!
//! Every restored entry is validated with the API's rules ([`SavedState::check`]): interface
//! names (no NUL, no `/`, not empty, at most 15 bytes), no duplicate port, not the uplink's name,
//! each vif's policy on its own. A file that breaks them is refused, never partly used.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;
use vqos_sched::VifPolicy;

use crate::backend::Port;
use crate::wire::{check_port_name, NoOtherFields, PortConfig, PortState};

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
    /// A symlink at the state file's path (refused, never followed or replaced).
    #[error(
        "State file {0} is a symlink: vqosd replaces the state file by rename and would replace \
         the link; set state_file to the real path"
    )]
    Symlink(PathBuf),
    /// The file parses but an entry breaks the API's rules.
    #[error("State file {path}: {message}")]
    Invalid {
        /// The state file.
        path: PathBuf,
        /// The entry and the rule it breaks.
        message: String,
    },
    /// The state file is unusable and so is its last-good copy.
    #[error(
        "State file {path} is unusable ({problem}) and so is its last-good copy ({last_good})"
    )]
    NoGoodCopy {
        /// The state file.
        path: PathBuf,
        /// What is wrong with it.
        problem: String,
        /// What is wrong with the copy (or that there is none).
        last_good: String,
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

/// One port as saved: how it is made with its policy, and what it acquired, side by side (the
/// keys of the API's `PortConfig` and `PortState`). Fields of older files that are absent take
/// their defaults (`kind`: a TAP, `port_security`: on, `create`: vqosd made it); a field this
/// build does not know is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SavedPort {
    /// How it is made, and its policy.
    #[serde(flatten)]
    pub port: PortConfig<VifPolicy>,
    /// Addresses locked to it first come, its identity handed over.
    #[serde(flatten)]
    pub state: PortState,
    /// No other field.
    #[serde(flatten)]
    pub no_other_fields: NoOtherFields,
}

impl SavedPort {
    /// `port` with its `policy`, as saved.
    pub fn new(port: &Port, policy: VifPolicy) -> SavedPort {
        SavedPort {
            port: port.config.clone().with_policy(policy),
            state: port.state.clone(),
            no_other_fields: NoOtherFields,
        }
    }

    /// The daemon's port and its policy.
    pub fn into_port(self) -> (Port, VifPolicy) {
        let policy = self.port.policy.clone();
        let port = Port {
            config: self.port.with_policy(()),
            state: self.state,
        };
        (port, policy)
    }
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
    /// The next port id to give ([`crate::wire::PortId`]): kept so that an id is never given
    /// twice, also after its port was deleted. Absent from files older than ids (the start
    /// then gives ids above every saved one).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub next_id: u64,
}

/// Port ids stay below this (2^53: exact in any JSON reader), so giving the next never wraps.
pub const MAX_PORT_ID: u64 = 1 << 53;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StateError + '_ {
    move |source| StateError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl SavedState {
    /// Checks every entry with the API's rules: port and removed names are interface names, no
    /// port appears twice, none is named as the uplink, no two ports have one id and ids are
    /// below [`MAX_PORT_ID`], each vif's policy is valid on its own.
    /// (Whether the policies fit together with the config's is checked by the caller.)
    pub fn check(&self, uplink: Option<&str>) -> Result<(), String> {
        for (i, p) in self.ports.iter().enumerate() {
            let name = &p.port.name;
            check_port_name(name).map_err(|e| format!("port {}: {e}", i + 1))?;
            if self.ports[..i].iter().any(|q| q.port.name == *name) {
                return Err(format!("port '{name}' is listed twice"));
            }
            if uplink == Some(name.as_str()) {
                return Err(format!("port '{name}' is the uplink"));
            }
            let id = p.state.id;
            if id.is_given() && self.ports[..i].iter().any(|q| q.state.id == id) {
                return Err(format!("port '{name}': id {id} is another port's too"));
            }
            if id.0 >= MAX_PORT_ID {
                return Err(format!("port '{name}': id {id} is out of range"));
            }
            p.port.policy.validate(name).map_err(|e| e.to_string())?;
        }
        if self.next_id >= MAX_PORT_ID {
            return Err(format!("next_id {} is out of range", self.next_id));
        }
        for name in &self.removed {
            check_port_name(name).map_err(|e| format!("removed port: {e}"))?;
        }
        Ok(())
    }
}

/// Path of the last-good copy of the state file at `path`: `<path>.last-good`.
pub fn last_good_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".last-good");
    PathBuf::from(p)
}

/// Path where a state file that could not be used is set aside: `<path>.corrupt`.
pub fn corrupt_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".corrupt");
    PathBuf::from(p)
}

fn dir_and_name(path: &Path) -> (PathBuf, String) {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path
        .file_name()
        .map_or_else(|| "state".into(), |n| n.to_string_lossy().into_owned());
    (dir, name)
}

/// The one temporary file of saves to `path`: `.<name>.tmp` in the same directory.
pub fn temp_path(path: &Path) -> PathBuf {
    let (dir, name) = dir_and_name(path);
    dir.join(format!(".{name}.tmp"))
}

/// Reads and checks the state file; `Ok(None)` when it does not exist (first start). A symlink
/// is refused ([`StateError::Symlink`]), never followed.
pub fn load(path: &Path, uplink: Option<&str>) -> Result<Option<SavedState>, StateError> {
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => return Err(StateError::Symlink(path.into())),
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(path)(e)),
    }
    // O_NOFOLLOW: a symlink that appeared since the check is refused too (ELOOP).
    let text = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| {
            let mut t = String::new();
            io::Read::read_to_string(&mut f, &mut t).map(|_| t)
        });
    let text = match text {
        Ok(t) => t,
        Err(e) if e.raw_os_error() == Some(libc::ELOOP) => {
            return Err(StateError::Symlink(path.into()))
        }
        Err(e) if e.kind() == io::ErrorKind::InvalidData => {
            return Err(StateError::Corrupt {
                path: path.to_path_buf(),
                message: "not UTF-8".into(),
            })
        }
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
    state.check(uplink).map_err(|message| StateError::Invalid {
        path: path.to_path_buf(),
        message,
    })?;
    Ok(Some(state))
}

/// What [`restore`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restored {
    /// The state to restore (`None`: no state file and no copy, a first start).
    pub state: Option<SavedState>,
    /// Loud warnings for the operator (a fallback to the last-good copy, a missing file that
    /// was expected); the daemon prints each.
    pub warnings: Vec<String>,
}

/// Reads the state at start: the state file, or its last-good copy when the file is corrupt,
/// invalid or missing (see the module docs). `expect_state`: the operator says a state file
/// must exist (the config's `expect_state`), so a missing one is warned about. Stale temporary
/// files of earlier saves are removed. Symlinks, I/O errors and unknown versions are errors,
/// without fallback.
pub fn restore(
    path: &Path,
    uplink: Option<&str>,
    expect_state: bool,
) -> Result<Restored, StateError> {
    read_state(path, uplink, expect_state, false)
}

/// What [`restore`] would restore and refuse, without its side effects (no stale temporary
/// file removed, no corrupt file set aside): for `vqosd --check`.
pub fn check(
    path: &Path,
    uplink: Option<&str>,
    expect_state: bool,
) -> Result<Restored, StateError> {
    read_state(path, uplink, expect_state, true)
}

/// [`restore`], or [`check`] when `dry`.
fn read_state(
    path: &Path,
    uplink: Option<&str>,
    expect_state: bool,
    dry: bool,
) -> Result<Restored, StateError> {
    if !dry {
        remove_stale_temps(path);
    }
    let mut warnings = Vec::new();
    let problem = match load(path, uplink) {
        Ok(Some(state)) => {
            return Ok(Restored {
                state: Some(state),
                warnings,
            })
        }
        Ok(None) => None,
        Err(e @ (StateError::Corrupt { .. } | StateError::Invalid { .. })) => Some(e.to_string()),
        Err(e) => return Err(e),
    };
    let copy = last_good_path(path);
    match (&problem, load(&copy, uplink)) {
        (None, Ok(None)) => {
            if expect_state {
                warnings.push(format!(
                    "State file {} is missing though the config says it must exist \
                     (expect_state): starting with the config's ports and policies only; every \
                     port and policy made through the API is gone",
                    path.display()
                ));
            }
            Ok(Restored {
                state: None,
                warnings,
            })
        }
        (_, Ok(Some(state))) => {
            match &problem {
                Some(p) => {
                    let aside = corrupt_path(path);
                    let kept = if dry {
                        format!("it would be kept as {}", aside.display())
                    } else {
                        match fs::rename(path, &aside) {
                            Ok(()) => format!("it is kept as {}", aside.display()),
                            Err(e) => format!("it could not be set aside ({e})"),
                        }
                    };
                    warnings.push(format!(
                        "{p}; restored the last-good copy {} instead ({kept}); changes made \
                         after that copy was written are lost",
                        copy.display()
                    ));
                }
                None => warnings.push(format!(
                    "State file {} is missing; restored its last-good copy {} (delete both to \
                     start afresh)",
                    path.display(),
                    copy.display()
                )),
            }
            Ok(Restored {
                state: Some(state),
                warnings,
            })
        }
        (Some(p), Ok(None)) => Err(StateError::NoGoodCopy {
            path: path.to_path_buf(),
            problem: p.clone(),
            last_good: format!("{} does not exist", copy.display()),
        }),
        (problem, Err(e)) => Err(StateError::NoGoodCopy {
            path: path.to_path_buf(),
            problem: problem
                .clone()
                .unwrap_or_else(|| "it does not exist".to_string()),
            last_good: e.to_string(),
        }),
    }
}

/// Removes the temporary files of saves that never finished: `.<name>.tmp`, and the
/// `.<name>.tmp.<pid>` files of older builds. Best effort: a failure only leaves a file.
fn remove_stale_temps(path: &Path) {
    let (dir, name) = dir_and_name(path);
    let _ = fs::remove_file(temp_path(path));
    let _ = fs::remove_file(temp_path(&last_good_path(path)));
    let legacy = format!(".{name}.tmp.");
    if let Ok(entries) = fs::read_dir(&dir) {
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if let Some(pid) = n.strip_prefix(&legacy) {
                if !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}

/// Writes `state` to `path` atomically (temp file, fsync, rename, fsync of the directory).
/// Creates the directory if needed. The file is readable by its owner only.
///
/// Once the rename succeeded the new state is the file's content, so an error of the final
/// fsync of the directory does not make the save fail (the caller must not undo a change that
/// is on disk): it is logged, and only a crash before the kernel writes the directory back could
/// still lose the rename. The same bytes then go, the same way, to [`last_good_path`]; a
/// failure there is logged and does not fail the save.
pub fn save(path: &Path, state: &SavedState) -> Result<(), StateError> {
    let mut json = serde_json::to_vec_pretty(state).map_err(|e| StateError::Corrupt {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    json.push(b'\n');
    write_atomic(path, &json)?;
    // The copy is a convenience for the next start: a failure only warns, the change is saved.
    let copy = last_good_path(path);
    if let Err(e) = write_atomic(&copy, &json) {
        tracing::warn!(
            "State saved to {} but its last-good copy {} was not: {}",
            path.display(),
            copy.display(),
            vqos_api::chain(&e)
        );
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically through its one temporary file (see [`save`]).
fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let (dir, _) = dir_and_name(path);
    fs::create_dir_all(&dir).map_err(io_err(&dir))?;
    let tmp = temp_path(path);
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
    if let Err(e) = f.write_all(bytes).and_then(|_| f.sync_all()) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(&tmp)(e));
    }
    drop(f);
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(io_err(path)(e));
    }
    if let Err(e) = File::open(&dir).and_then(|d| d.sync_all()) {
        tracing::warn!(
            "State saved to {} but the fsync of {} failed: {e}; \
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

    fn names_in(dir: &Path) -> Vec<String> {
        let mut names: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    fn sample() -> SavedState {
        SavedState {
            version: STATE_VERSION,
            ports: vec![SavedPort {
                port: PortConfig {
                    create: false,
                    macs: vec!["02:00:00:00:00:01".parse().unwrap()],
                    ips: vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
                    serves: vec![vqos_api::wire::Service::DhcpServer],
                    policy: VifPolicy {
                        weight: 3,
                        min_bps: 200_000_000,
                        max_bps: Some(500_000_000),
                        priority: 1,
                        max_in_bps: Some(100_000_000),
                        burst_bytes: Some(65_536),
                    },
                    ..PortConfig::tap("vm1")
                },
                state: PortState {
                    id: vqos_api::wire::PortId(3),
                    locked: vqos_api::wire::LockedAddrs {
                        macs: vec![],
                        ips: vec!["fe80::5".parse().unwrap()],
                    },
                    handover: None,
                },
                no_other_fields: NoOtherFields,
            }],
            removed: Vec::new(),
            next_id: 4,
        }
    }

    #[test]
    fn save_then_load_round_trips_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/state.json");
        assert!(load(&path, None).unwrap().is_none());
        save(&path, &sample()).unwrap();
        let mut second = sample();
        second.ports[0].port.policy.weight = 9;
        save(&path, &second).unwrap();
        assert_eq!(load(&path, None).unwrap(), Some(second));
        assert_eq!(
            names_in(path.parent().unwrap()),
            vec!["state.json".to_string(), "state.json.last-good".to_string()]
        );
    }

    #[test]
    fn corrupt_and_future_files_are_refused_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        fs::write(&path, "{not json").unwrap();
        let e = load(&path, None).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("State file {}", path.display())),
            "{e}"
        );
        fs::write(&path, r#"{"version": 99, "ports": []}"#).unwrap();
        assert!(matches!(
            load(&path, None),
            Err(StateError::Version { version: 99, .. })
        ));
    }

    #[test]
    fn duplicate_and_out_of_range_port_ids_are_refused() {
        let mut two = sample();
        let mut vm2 = two.ports[0].clone();
        vm2.port.name = "vm2".into();
        two.ports.push(vm2);
        assert_eq!(
            two.check(None).unwrap_err(),
            "port 'vm2': id 3 is another port's too"
        );
        two.ports[1].state.id = vqos_api::wire::PortId(0);
        two.check(None).unwrap();
        two.ports[1].state.id = vqos_api::wire::PortId(MAX_PORT_ID);
        assert!(two.check(None).unwrap_err().contains("out of range"));
        let mut next = sample();
        next.next_id = u64::MAX;
        assert_eq!(
            next.check(None).unwrap_err(),
            format!("next_id {} is out of range", u64::MAX)
        );
    }

    #[test]
    fn a_symlink_at_the_temp_path_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        let victim = dir.path().join("victim");
        fs::write(&victim, "precious").unwrap();
        let tmp = temp_path(&path);
        std::os::unix::fs::symlink(&victim, &tmp).unwrap();
        save(&path, &sample()).unwrap();
        assert_eq!(fs::read_to_string(&victim).unwrap(), "precious");
        assert_eq!(load(&path, None).unwrap(), Some(sample()));
        assert!(!fs::symlink_metadata(&path)
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(fs::symlink_metadata(&tmp).is_err(), "temp file left behind");
        // A stale regular temp file is replaced too.
        fs::write(&tmp, "stale").unwrap();
        save(&path, &sample()).unwrap();
        assert_eq!(load(&path, None).unwrap(), Some(sample()));
    }

    #[test]
    fn failed_write_keeps_the_old_state() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json");
        save(&path, &sample()).unwrap();
        // A directory in the way of the temp file makes the write fail.
        let tmp = temp_path(&path);
        fs::create_dir(&tmp).unwrap();
        fs::write(tmp.join("x"), "x").unwrap();
        let mut changed = sample();
        changed.ports.clear();
        assert!(save(&path, &changed).is_err());
        assert_eq!(load(&path, None).unwrap(), Some(sample()));
    }
}
