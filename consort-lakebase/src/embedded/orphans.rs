//! Cluster directories placed outside their project ([`fallback_dir`]), and removing those
//! whose project is gone.
//!
//! A fallback directory `/tmp/consort-pg-<hash>` records the directory it stands in for in
//! `requested` (written at every start). It is *orphaned* when neither that directory nor the
//! directory it was to be made in exists any more: for a project, `<project>/.consort/pg` and
//! `<project>/.consort`. A directory without a readable record, with a record that does not hash
//! to its name, or whose server's owner is alive is never removed.

use std::path::{Path, PathBuf};

use super::owner::{self, Holder};
use super::runas::fallback_dir;
use crate::error::{ClusterError, Error, Result};

/// Where fallback directories are made.
const ROOT: &str = "/tmp";
/// Their name: this prefix, then 16 hex digits.
const PREFIX: &str = "consort-pg-";

/// A cluster directory placed outside its project, as [`placed_clusters`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedCluster {
    /// The fallback directory.
    pub dir: PathBuf,
    /// The directory it stands in for, when a readable record says so.
    pub requested: Option<PathBuf>,
    /// What it holds on disk, in bytes.
    pub bytes: u64,
    /// Whether it may be removed.
    pub state: Placement,
}

/// Whether a fallback cluster directory may be removed.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Placement {
    /// Its project is gone and no live process owns its server: it may be removed.
    Orphaned,
    /// The directory it stands in for (or the one it was to be made in) still exists.
    ProjectExists,
    /// A live process owns the server running in it.
    InUse {
        /// The server's pid.
        pid: u32,
    },
    /// It has no readable record of its project (made before Consort wrote one, or damaged).
    Unrecorded {
        /// Why the record does not say.
        why: String,
    },
}

impl std::fmt::Display for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Placement::Orphaned => write!(f, "its project no longer exists"),
            Placement::ProjectExists => write!(f, "its project exists"),
            Placement::InUse { pid } => {
                write!(f, "its server (pid {pid}) is in use by a running process")
            }
            Placement::Unrecorded { why } => {
                write!(f, "{why}; delete it by hand if its project is gone")
            }
        }
    }
}

/// Every fallback cluster directory on this machine, by name.
pub fn placed_clusters() -> Vec<PlacedCluster> {
    placed_clusters_in(Path::new(ROOT))
}

fn placed_clusters_in(root: &Path) -> Vec<PlacedCluster> {
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut found: Vec<PlacedCluster> = entries
        .filter_map(|e| e.ok())
        .filter(|e| is_fallback_name(&e.file_name().to_string_lossy()))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| examine(&e.path()))
        .collect();
    found.sort_by(|a, b| a.dir.cmp(&b.dir));
    found
}

fn is_fallback_name(name: &str) -> bool {
    name.strip_prefix(PREFIX)
        .is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// What a fallback directory is, from its record and its server.
fn examine(dir: &Path) -> PlacedCluster {
    let requested = owner::read_requested(dir);
    let state = match &requested {
        None => Placement::Unrecorded {
            why: "it has no readable record of its project".into(),
        },
        Some(req) if fallback_dir(req).file_name() != dir.file_name() => Placement::Unrecorded {
            why: format!(
                "its record names {}, whose cluster would be elsewhere",
                req.display()
            ),
        },
        Some(req) if req.exists() || req.parent().is_none_or(Path::exists) => {
            Placement::ProjectExists
        }
        Some(_) => match owner::holder(dir, &dir.join("data")) {
            Holder::Owned(pid) => Placement::InUse { pid },
            _ => Placement::Orphaned,
        },
    };
    PlacedCluster {
        dir: dir.to_path_buf(),
        requested,
        bytes: size_of(dir),
        state,
    }
}

/// The bytes the files under `dir` take (links not followed; what cannot be read counts 0).
pub(crate) fn size_of(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.metadata() {
            Ok(m) if m.is_dir() => size_of(&e.path()),
            Ok(m) => m.len(),
            Err(_) => 0,
        })
        .sum()
}

/// Removes an orphaned fallback directory, looked at again first: a server still running in
/// it (its owner gone) is stopped and waited for. Returns the bytes freed; a directory that is
/// not orphaned (any more) is refused with [`Error::Cluster`] and left alone.
pub async fn remove_orphan(dir: &Path) -> Result<u64> {
    if !dir
        .file_name()
        .is_some_and(|n| is_fallback_name(&n.to_string_lossy()))
    {
        return Err(ClusterError::NotFallbackDir {
            dir: dir.to_path_buf(),
        }
        .into());
    }
    let now = examine(dir);
    if now.state != Placement::Orphaned {
        return Err(ClusterError::Kept {
            dir: dir.to_path_buf(),
            state: now.state,
        }
        .into());
    }
    let data_dir = dir.join("data");
    match owner::holder(dir, &data_dir) {
        Holder::Abandoned(pid) => owner::stop_abandoned(pid, &data_dir).await?,
        Holder::Exiting(pid) => owner::wait_exited(pid, &data_dir, STOP_PATIENCE).await?,
        Holder::Owned(pid) => {
            return Err(ClusterError::TakenIntoUse {
                dir: dir.to_path_buf(),
                pid,
            }
            .into());
        }
        Holder::Free | Holder::Foreign(_) | Holder::Stale => {}
    }
    std::fs::remove_dir_all(dir)
        .map_err(|e| Error::cluster_io(format!("remove {}", dir.display()), e))?;
    Ok(now.bytes)
}

/// How long a server that has exited is waited for before its directory is removed.
const STOP_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_fallback_names_are_considered() {
        assert!(is_fallback_name("consort-pg-0123456789abcdef"));
        assert!(!is_fallback_name("consort-pg-tmp-0123456789ab"));
        assert!(!is_fallback_name("consort-pg-0123"));
        assert!(!is_fallback_name("consort-sock-0123456789abcdef"));
    }

    #[test]
    fn a_directory_is_orphaned_only_when_its_record_says_its_project_is_gone() {
        let root = tempfile::tempdir().expect("root");
        let project = tempfile::tempdir().expect("project");
        std::fs::create_dir(project.path().join(".consort")).expect(".consort");
        let kept_req = project.path().join(".consort").join("pg");
        let gone_req = project.path().join("gone").join(".consort").join("pg");
        let make = |req: Option<&Path>, name: &str| {
            let dir = match req {
                Some(r) => root.path().join(fallback_dir(r).file_name().expect("name")),
                None => root.path().join(name),
            };
            std::fs::create_dir(&dir).expect("mkdir");
            std::fs::write(dir.join("postgres.log"), "x".repeat(1000)).expect("log");
            if let Some(r) = req {
                owner::record_requested(&dir, r).expect("record");
            }
            dir
        };
        let kept = make(Some(&kept_req), "");
        let gone = make(Some(&gone_req), "");
        let bare = make(None, "consort-pg-00000000000000ff");
        let wrong = make(None, "consort-pg-00000000000000fe");
        owner::record_requested(&wrong, &gone_req).expect("a record of another directory");
        std::fs::create_dir(root.path().join("consort-pg-tmp-000000000000")).expect("tmp");

        let found = placed_clusters_in(root.path());
        let state = |d: &Path| {
            found
                .iter()
                .find(|c| c.dir == d)
                .map(|c| c.state.clone())
                .expect("listed")
        };
        assert_eq!(found.len(), 4, "the temporary cluster's name is not listed");
        assert_eq!(state(&kept), Placement::ProjectExists);
        assert_eq!(state(&gone), Placement::Orphaned);
        assert!(matches!(state(&bare), Placement::Unrecorded { .. }));
        assert!(matches!(state(&wrong), Placement::Unrecorded { .. }));
        assert!(found.iter().all(|c| c.bytes >= 1000));
    }
}
