//! A run's view of the work tree: the directory every process of a run starts in.
//!
//! Test tools assume they may write beside their own configuration (vite writes
//! `vitest.config.js.timestamp-….mjs` next to the config it loads) and walk every directory
//! under their root (vitest 1 scans the whole tree and dies on a directory it may not list).
//! Neither may touch the real tree: it is read-only to a run, and Consort's private state in
//! it is unreadable. So, for a runner configured so (`CommandRunnerConfig::view`; jest's
//! crawler, for one, does not follow links), each process starts in a fresh *view*: a directory of the run's own
//! whose entries are symbolic links to the tree's top-level entries, Consort's private state
//! left out (a directory that merely contains private state is made again in the view, its
//! other entries linked).
//!
//! What a run may do in a view (the confinement's rules for the views directory, see
//! `sandbox.rs`): read, create files and directories, and write the files it created. It may
//! not remove, rename or replace an entry, nor make a link: the links to the tree stand for the
//! whole run, and a write through one reaches the tree's file, which the confinement keeps
//! read-only (the caches excepted). What a process creates in its view is never hashed, never
//! judged, seen by no other process of the run, and removed with the run's scratch directory.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// Makes a fresh view of `tree` under `views` (see the module documentation): a new directory
/// whose entries link to the tree's, none of `hidden` (canonical paths) reachable from it.
pub(crate) fn make_view(views: &Path, tree: &Path, hidden: &[PathBuf]) -> Result<PathBuf> {
    let view = views.join(crate::names::random_tag(12));
    mkdir(&view)?;
    mirror(&view, tree, hidden)?;
    Ok(view)
}

/// Links every entry of `dir` into `into`, but the hidden ones; a directory holding a hidden
/// path is made in `into` and mirrored one level deeper.
fn mirror(into: &Path, dir: &Path, hidden: &[PathBuf]) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error::io(format!("list {}", dir.display()), e))?;
        let path = entry.path();
        // What the entry reaches decides (a link in the tree onto private state stays out).
        let real = path.canonicalize().unwrap_or_else(|_| path.clone());
        if hidden.iter().any(|h| real.starts_with(h)) {
            continue;
        }
        let target = into.join(entry.file_name());
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        if is_dir && hidden.iter().any(|h| h.starts_with(&real)) {
            mkdir(&target)?;
            mirror(&target, &path, hidden)?;
        } else {
            std::os::unix::fs::symlink(&path, &target)
                .map_err(|e| Error::io(format!("link {}", target.display()), e))?;
        }
    }
    Ok(())
}

fn mkdir(dir: &Path) -> Result<()> {
    std::fs::create_dir(dir).map_err(|e| Error::io(format!("create {}", dir.display()), e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_links_the_tree_and_leaves_private_state_out() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("canonical");
        let tree = root.join("work");
        for d in ["tests", ".consort/pg", "db/pg", "db/migrations", ".git"] {
            std::fs::create_dir_all(tree.join(d)).expect("mkdir");
        }
        std::fs::write(tree.join("vitest.config.js"), "export default {}").expect("write");
        std::fs::write(tree.join("db/migrations/1.sql"), "select 1;").expect("write");
        std::os::unix::fs::symlink(tree.join(".consort"), tree.join("sneaky")).expect("link");
        let views = root.join("views");
        mkdir(&views).expect("views");
        let hidden = vec![tree.join(".consort"), tree.join("db/pg")];
        let view = make_view(&views, &tree, &hidden).expect("view");

        let mut names: Vec<String> = std::fs::read_dir(&view)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        assert_eq!(names, [".git", "db", "tests", "vitest.config.js"]);
        assert_eq!(
            std::fs::read_link(view.join("vitest.config.js")).expect("a link"),
            tree.join("vitest.config.js")
        );
        assert!(
            view.join("db").symlink_metadata().expect("db").is_dir(),
            "a directory holding private state is made again"
        );
        assert!(view.join("db/migrations/1.sql").exists());
        assert!(!view.join("db/pg").exists(), "the private state stays out");
        let again = make_view(&views, &tree, &hidden).expect("a second view");
        assert_ne!(again, view, "every process gets a fresh view");
    }
}
