//! Whether a file system clones files (reflinks: XFS, Btrfs, …), so that PostgreSQL 18 can
//! make a branch's files as clones of its base's (`file_copy_method = clone`) instead of
//! copying them.

use std::path::Path;
use std::process::{Command, Stdio};

/// The first PostgreSQL major version that clones files in `CREATE DATABASE … STRATEGY
/// FILE_COPY`.
pub(super) const FIRST_CLONING_MAJOR: u32 = 18;

/// Whether the file system of the directory `dir` clones files: a small file written there
/// is cloned with `cp --reflink=always` (which never falls back to a copy). Both files are
/// removed; any failure (no such file system, no `cp` that clones) answers no.
pub(super) fn clones_files(dir: &Path) -> bool {
    let probe = dir.join(".consort-reflink-probe");
    let clone = dir.join(".consort-reflink-probe.clone");
    let cloned = std::fs::write(&probe, [0u8; 4096]).is_ok()
        && Command::new("cp")
            .arg("--reflink=always")
            .arg(&probe)
            .arg(&clone)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    let _ = std::fs::remove_file(&probe);
    let _ = std::fs::remove_file(&clone);
    cloned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_that_is_not_there_does_not_clone() {
        assert!(!clones_files(Path::new("/nonexistent/consort")));
    }
}
