//! The tenant shares in force and their fallbacks, saved next to the state file so that a
//! restart while etcd is unreachable keeps every cap (docs/cluster.md, "Failure behaviour"):
//! the next start holds the fallbacks (a restarted agent's view has lapsed; what the others
//! count for it once they are sure is its fallback), or the shares of a file from before them.
//!
//! The file is `<state file>.cluster-shares.json`, written when the shares change: the JSON goes
//! to `.<name>.tmp` in the same directory, which is fsynced and renamed over the file, and the
//! directory is fsynced, so a reader (the next start) sees the old or the new shares whole.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use vqos_cluster::Share;

/// The file's version (a newer daemon's file is not read).
const VERSION: u32 = 1;

/// The file's contents.
#[derive(Debug, Serialize, Deserialize)]
struct File {
    /// [`VERSION`].
    version: u32,
    /// The shares by vif name.
    shares: BTreeMap<String, Share>,
    /// Their fallbacks (`vqos_cluster::grants::fall_back`), by vif name (absent: a file from
    /// before the grants).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    fallback: Option<BTreeMap<String, Share>>,
}

/// What the file holds: the shares and their fallbacks.
type Saved = (BTreeMap<String, Share>, Option<BTreeMap<String, Share>>);

/// The shares' file, and what it holds (so an unchanged set is not written again).
#[derive(Debug)]
pub(super) struct SavedShares {
    /// The file.
    path: PathBuf,
    /// What it holds (`None`: not known yet).
    written: Option<Saved>,
}

impl SavedShares {
    /// The shares' file `path`.
    pub fn new(path: PathBuf) -> SavedShares {
        SavedShares {
            path,
            written: None,
        }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The shares to hold at start: the saved fallbacks, or the saved shares of a file without
    /// them (`None`: no file).
    pub fn load(&mut self) -> Result<Option<BTreeMap<String, Share>>, String> {
        let bytes = match fs::read(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(format!("Cannot read {}: {e}", self.path.display())),
        };
        let file: File = serde_json::from_slice(&bytes)
            .map_err(|e| format!("Cannot read {}: {e}", self.path.display()))?;
        if file.version != VERSION {
            return Err(format!(
                "Cannot read {}: version {} (this vqosd reads {VERSION})",
                self.path.display(),
                file.version
            ));
        }
        self.written = Some((file.shares.clone(), file.fallback.clone()));
        Ok(Some(file.fallback.unwrap_or(file.shares)))
    }

    /// Saves `shares` and their `fallback` if they are not what the file holds.
    pub fn save(
        &mut self,
        shares: &BTreeMap<String, Share>,
        fallback: &BTreeMap<String, Share>,
    ) -> Result<(), String> {
        let saved = (shares.clone(), Some(fallback.clone()));
        if self.written.as_ref() == Some(&saved) {
            return Ok(());
        }
        let file = File {
            version: VERSION,
            shares: shares.clone(),
            fallback: Some(fallback.clone()),
        };
        let body = serde_json::to_vec_pretty(&file).map_err(|e| e.to_string())?;
        write_atomically(&self.path, &body).map_err(|e| {
            format!(
                "Cannot save the tenant shares to {}: {e}",
                self.path.display()
            )
        })?;
        self.written = Some(saved);
        Ok(())
    }
}

/// Writes `body` to `path` through a temporary file in its directory, renamed over it.
fn write_atomically(path: &Path, body: &[u8]) -> std::io::Result<()> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = dir.join(format!(".{name}.tmp"));
    {
        let mut f = fs::File::create(&tmp)?;
        f.write_all(body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, path)?;
    fs::File::open(&dir)?.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_survive_a_restart_and_are_written_whole_and_only_when_changed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("state.json.cluster-shares.json");
        let mut s = SavedShares::new(path.clone());
        assert_eq!(s.load(), Ok(None));
        let shares = BTreeMap::from([(
            "vm1".to_string(),
            Share {
                min_bps: 1_000_000,
                max_bps: Some(100_000_000),
            },
        )]);
        let fallback = BTreeMap::from([(
            "vm1".to_string(),
            Share {
                min_bps: 500_000,
                max_bps: Some(50_000_000),
            },
        )]);
        s.save(&shares, &fallback).unwrap();
        // The next start holds the fallbacks; no temporary file is left.
        let mut again = SavedShares::new(path.clone());
        assert_eq!(again.load(), Ok(Some(fallback.clone())));
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, ["state.json.cluster-shares.json"]);
        // Unchanged: not written (a file removed behind its back stays removed).
        fs::remove_file(&path).unwrap();
        again.save(&shares, &fallback).unwrap();
        assert!(!path.exists());
        // A file from before the fallbacks: its shares.
        let old = r#"{"version": 1, "shares": {"vm1": {"min_bps": 1, "max_bps": 2}}}"#;
        fs::write(&path, old).unwrap();
        assert_eq!(again.load().unwrap().unwrap()["vm1"].max_bps, Some(2));
        // A file of another version or not JSON is an error, not shares.
        fs::write(&path, br#"{"version": 2, "shares": {}}"#).unwrap();
        assert!(again.load().unwrap_err().contains("version 2"));
        fs::write(&path, b"{").unwrap();
        assert!(again.load().unwrap_err().starts_with("Cannot read"));
    }
}
