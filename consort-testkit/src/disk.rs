//! A fake disk (path → content) that applies change sets the way the conductor does: each
//! apply hands back the inverse change set that undoes it; and real trees of files on disk.

use std::collections::BTreeMap;
use std::path::Path;

use consort_actors::{ChangeSet, ContentHash, Event, FileChange, FileHashes};

/// Files by path, in memory, as bytes (like a real disk: a restore of raw bytes round-trips).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FakeDisk {
    /// The files: path → content.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl FakeDisk {
    /// An empty disk.
    pub fn new() -> Self {
        FakeDisk::default()
    }

    /// Applies `set` in order and returns its inverse (restores or deletes each path, in the
    /// reverse order).
    pub fn apply(&mut self, set: &ChangeSet) -> ChangeSet {
        let mut inverse = Vec::with_capacity(set.changes.len());
        for c in &set.changes {
            inverse.push(match self.files.get(c.path()) {
                Some(content) => FileChange::exactly(c.path().into(), content.clone()),
                None => FileChange::Delete {
                    path: c.path().into(),
                },
            });
            match c.bytes() {
                Some(bytes) => {
                    self.files.insert(c.path().into(), bytes.into_owned());
                }
                None => {
                    self.files.remove(c.path());
                }
            }
        }
        inverse.reverse();
        ChangeSet {
            summary: "undo".into(),
            changes: inverse,
        }
    }

    /// Applies `set` and returns the `Applied` event the conductor records for it.
    pub fn applied(&mut self, set: &ChangeSet) -> Event {
        let inverse = self.apply(set);
        Event::Applied {
            workspace_hash: self.workspace_hash(),
            tests: self.test_hashes(),
            inverse,
        }
    }

    /// The hashes of the files under `tests/`.
    pub fn test_hashes(&self) -> FileHashes {
        self.files
            .iter()
            .filter(|(p, _)| p.starts_with("tests/"))
            .map(|(p, c)| (p.clone(), ContentHash::of_bytes(c)))
            .collect()
    }

    /// The hash of the whole disk.
    pub fn workspace_hash(&self) -> ContentHash {
        ContentHash::of(&self.files)
    }
}

/// Writes `files` (path relative to `root`, content) under `root`, making their directories.
pub fn write_tree(root: &Path, files: &[(&str, &str)]) {
    for (rel, content) in files {
        let p = root.join(rel);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent).expect("mkdir");
        }
        std::fs::write(&p, content).expect("write");
    }
}

/// A fresh temporary directory holding `files` (path, content).
pub fn tree_of(files: &[(&str, &str)]) -> tempfile::TempDir {
    let tree = tempfile::tempdir().expect("tree");
    write_tree(tree.path(), files);
    tree
}
