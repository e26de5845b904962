//! The project's work tree on disk: hashing it, reading it, and applying change sets safely.
//!
//! **Only the conductor writes the work tree**, through [`WorkTree::apply`], after the state
//! machine accepted the change set. Every path is confined to the tree: lexically (no absolute
//! paths, no `..`) and physically (no symlink on the way that leads outside).

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::artifact::{ChangeSet, FileChange, FileHashes};
use crate::hash::ContentHash;
use crate::paths::{PathError, normalise_relative};

/// Directories never hashed or listed: Consort's state, VCS data, build output.
pub const SKIPPED_DIRS: [&str; 4] = [".consort", ".git", "target", "node_modules"];

/// A file-system failure in the work tree.
#[derive(Debug, thiserror::Error)]
pub enum WorkTreeError {
    /// A path was refused.
    #[error(transparent)]
    Path(#[from] PathError),
    /// An I/O error on a path.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path (relative when possible).
        path: String,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// A file is not UTF-8 text.
    #[error("{path} is not UTF-8 text")]
    NotText {
        /// The path.
        path: String,
    },
}

fn io_err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> WorkTreeError + 'a {
    move |source| WorkTreeError::Io {
        op,
        path: path.display().to_string(),
        source,
    }
}

/// A handle on the work tree directory.
#[derive(Debug, Clone)]
pub struct WorkTree {
    root: PathBuf,
}

impl WorkTree {
    /// A work tree rooted at `root` (created if missing).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, WorkTreeError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io_err("create", &root))?;
        let root = root.canonicalize().map_err(io_err("resolve", &root))?;
        Ok(WorkTree { root })
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Resolves a relative path inside the tree, refusing anything that leaves it.
    pub fn resolve(&self, rel: &str) -> Result<(String, PathBuf), WorkTreeError> {
        let norm = normalise_relative(rel)?;
        let full = self.root.join(&norm);
        // Walk every existing ancestor: a symlink on the way must stay inside the tree.
        let mut cur = self.root.clone();
        for comp in norm.split('/') {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target = cur.canonicalize().ok();
                    match target {
                        Some(t) if t.starts_with(&self.root) => {}
                        _ => return Err(PathError::EscapesThroughLink { path: norm }.into()),
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(io_err("inspect", &cur)(e)),
            }
        }
        Ok((norm, full))
    }

    /// Reads a text file, or `None` when it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<String>, WorkTreeError> {
        let (norm, full) = self.resolve(rel)?;
        match fs::read(&full) {
            Ok(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| WorkTreeError::NotText { path: norm }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &full)(e)),
        }
    }

    /// Applies a change set and returns its inverse (the change set that restores the files as
    /// they were). Every path is checked before any file is written.
    pub fn apply(&self, set: &ChangeSet) -> Result<ChangeSet, WorkTreeError> {
        let mut resolved = Vec::with_capacity(set.changes.len());
        for change in &set.changes {
            resolved.push(self.resolve(change.path())?);
        }
        let mut inverse = Vec::with_capacity(set.changes.len());
        for (change, (norm, full)) in set.changes.iter().zip(&resolved) {
            let before = match fs::read(full) {
                Ok(bytes) => Some(String::from_utf8_lossy(&bytes).into_owned()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(io_err("read", full)(e)),
            };
            inverse.push(match before {
                Some(content) => FileChange::Write {
                    path: norm.clone(),
                    content,
                },
                None => FileChange::Delete { path: norm.clone() },
            });
            match change {
                FileChange::Write { content, .. } => write_atomic(full, content.as_bytes())?,
                FileChange::Delete { .. } => match fs::remove_file(full) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("delete", full)(e)),
                },
            }
        }
        inverse.reverse();
        Ok(ChangeSet {
            summary: format!("undo: {}", set.summary),
            changes: inverse,
        })
    }

    /// Hashes every file of the tree (outside [`SKIPPED_DIRS`]): relative path → content hash.
    pub fn file_hashes(&self) -> Result<FileHashes, WorkTreeError> {
        let mut out = BTreeMap::new();
        walk(&self.root, &self.root, &mut |rel, full| {
            let bytes = fs::read(full).map_err(io_err("read", full))?;
            out.insert(rel.to_string(), ContentHash::of_bytes(&bytes));
            Ok(())
        })?;
        Ok(out)
    }

    /// One hash for the whole tree: the canonical hash of [`WorkTree::file_hashes`].
    pub fn hash(&self) -> Result<ContentHash, WorkTreeError> {
        Ok(ContentHash::of(&self.file_hashes()?))
    }

    /// Reads every text file whose relative path satisfies `keep`, up to `max_bytes` in total.
    pub fn read_matching(
        &self,
        keep: impl Fn(&str) -> bool,
        max_bytes: usize,
    ) -> Result<BTreeMap<String, String>, WorkTreeError> {
        let mut out = BTreeMap::new();
        let mut total = 0usize;
        walk(&self.root, &self.root, &mut |rel, full| {
            if !keep(rel) || total >= max_bytes {
                return Ok(());
            }
            let bytes = fs::read(full).map_err(io_err("read", full))?;
            if let Ok(text) = String::from_utf8(bytes) {
                total += text.len();
                out.insert(rel.to_string(), text);
            }
            Ok(())
        })?;
        Ok(out)
    }
}

impl WorkTree {
    /// The cache directories that exist in the tree (runs may write there; never hashed).
    pub fn cache_dirs(&self) -> Result<Vec<PathBuf>, WorkTreeError> {
        let mut out = Vec::new();
        for name in ["target", "node_modules"] {
            let p = self.root.join(name);
            if p.is_dir() {
                out.push(p);
            }
        }
        Ok(out)
    }
}

/// Hashes a work tree directory without opening a [`WorkTree`] handle.
pub fn hash_dir(root: &Path) -> Result<ContentHash, WorkTreeError> {
    WorkTree::open(root)?.hash()
}

fn walk(
    root: &Path,
    dir: &Path,
    visit: &mut dyn FnMut(&str, &Path) -> Result<(), WorkTreeError>,
) -> Result<(), WorkTreeError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .map_err(io_err("list", dir))?
        .filter_map(Result::ok)
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let ft = entry.file_type().map_err(io_err("inspect", &path))?;
        if ft.is_dir() {
            if dir == root && SKIPPED_DIRS.contains(&name.as_ref()) {
                continue;
            }
            walk(root, &path, visit)?;
        } else if ft.is_file() {
            let rel = path
                .strip_prefix(root)
                .unwrap_or(&path)
                .to_string_lossy()
                .replace('\\', "/");
            visit(&rel, &path)?;
        }
        // Symlinks are not followed and not hashed: agents cannot create them, and a link
        // planted by someone else never makes the conductor read outside the tree.
    }
    Ok(())
}

fn write_atomic(full: &Path, bytes: &[u8]) -> Result<(), WorkTreeError> {
    if let Some(parent) = full.parent() {
        fs::create_dir_all(parent).map_err(io_err("create", parent))?;
    }
    let tmp = full.with_extension(format!(
        "{}consort-tmp",
        full.extension()
            .map(|e| format!("{}.", e.to_string_lossy()))
            .unwrap_or_default()
    ));
    fs::write(&tmp, bytes).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, full).map_err(io_err("rename", full))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(path: &str, content: &str) -> FileChange {
        FileChange::Write {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn apply_then_inverse_restores_the_tree() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        fs::write(dir.path().join("keep.sql"), "old").expect("seed");
        let before = wt.hash().expect("hash");
        let set = ChangeSet {
            summary: "s".into(),
            changes: vec![
                write("keep.sql", "new"),
                write("src/a.sql", "a"),
                FileChange::Delete {
                    path: "nope".into(),
                },
            ],
        };
        let inverse = wt.apply(&set).expect("apply");
        assert_eq!(wt.read("keep.sql").expect("read").as_deref(), Some("new"));
        assert_ne!(wt.hash().expect("hash"), before);
        wt.apply(&inverse).expect("undo");
        assert_eq!(wt.read("keep.sql").expect("read").as_deref(), Some("old"));
        assert_eq!(wt.read("src/a.sql").expect("read"), None);
        assert_eq!(wt.hash().expect("hash"), before);
    }

    #[test]
    fn escapes_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).expect("symlink");
        for bad in ["../x", "/tmp/x", "link/evil.sql"] {
            let set = ChangeSet {
                summary: String::new(),
                changes: vec![write("ok.sql", "1"), write(bad, "x")],
            };
            assert!(wt.apply(&set).is_err(), "{bad} must be refused");
            assert_eq!(
                wt.read("ok.sql").expect("read"),
                None,
                "nothing applied for {bad}"
            );
        }
        assert!(fs::read_dir(outside.path()).expect("list").next().is_none());
    }

    #[test]
    fn consort_state_is_not_part_of_the_hash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        fs::write(dir.path().join("a.sql"), "a").expect("seed");
        let h = wt.hash().expect("hash");
        fs::create_dir_all(dir.path().join(".consort")).expect("mkdir");
        fs::write(dir.path().join(".consort/ledger.jsonl"), "{}").expect("seed");
        assert_eq!(wt.hash().expect("hash"), h);
    }
}
