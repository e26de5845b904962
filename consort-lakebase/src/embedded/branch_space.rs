//! Branches in memory: a kept embedded cluster makes its branch databases in a tablespace on a
//! memory file system (tmpfs), where making and dropping a branch's few hundred files costs a
//! fraction of what it costs on disk (on this project's machines a pair of `CREATE DATABASE`
//! and `DROP DATABASE` ran 5–8× faster; BENCHMARKS.md). Branches are throw-away by design; the
//! parent database and the base templates stay on disk with the rest of the cluster.
//!
//! **Where.** `/dev/shm/consort-branches-<hash of the cluster directory>` when Consort runs as
//! root: the directory belongs to the server's user with mode `0700`, so a confined test run
//! (root without any capability, and with a `/dev/shm` of its own) cannot enter it. When
//! Consort is not root, runs may write the machine's `/dev/shm`, so it is never used; the
//! user's own tmpfs, `$XDG_RUNTIME_DIR` (mode `0700`, theirs), is, and the place is one of the
//! provider's private paths that runs may not read. Nowhere (branches stay on disk) for a
//! temporary cluster, where neither is a tmpfs, where branches are clones already (PostgreSQL
//! 18 on a file system with reflinks), when `[database] branches_in_memory = false`, and for
//! each branch the memory has no room for (twice its base's size and 64 MiB to spare).
//!
//! **A reboot empties the tmpfs.** The cluster directory records the place ([`RECORD`]); each
//! start makes its directories again before the server starts. A server that had not shut
//! down cleanly replays its log, which may name pages of branches that went with the tmpfs:
//! that one start runs with `ignore_invalid_pages`, and those branches (empty now) are
//! dropped like any other leftover (`consort branches --sweep`).

use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};
use tokio_postgres::Client;
use tracing::{info, warn};

use super::cluster::{EmbeddedCluster, write_private};
use super::runas::RunAs;
use crate::error::{Error, Result};
use crate::names::quote_literal;

/// The tablespace branches are made in.
pub(crate) const TABLESPACE: &str = "consort_branches";
/// The file in the cluster directory that records the place: its path, then the name of the
/// server's version directory inside it (`PG_15_202209061`), one a line.
pub(super) const RECORD: &str = "branch-space";
/// The prefix of the place's name.
const PREFIX: &str = "consort-branches-";
/// The file in a place that names the cluster directory it belongs to.
const OWNER: &str = "cluster";
/// Memory left free beside a new branch.
const SPARE_BYTES: u64 = 64 << 20;

/// The place a cluster in `dir` keeps its branches when it makes one now (see the module
/// doc), or `None`.
pub(super) fn place_for(dir: &Path) -> Option<PathBuf> {
    let digest = Sha256::digest(dir.as_os_str().as_bytes());
    Some(root()?.join(format!("{PREFIX}{}", &hex::encode(digest)[..16])))
}

/// The tmpfs places are made in (see the module doc), or `None`.
fn root() -> Option<PathBuf> {
    let root = if nix::unistd::geteuid().is_root() {
        PathBuf::from("/dev/shm")
    } else {
        let runtime = PathBuf::from(std::env::var_os("XDG_RUNTIME_DIR")?);
        let meta = std::fs::symlink_metadata(&runtime).ok()?;
        let private = runtime.is_absolute()
            && meta.is_dir()
            && meta.uid() == nix::unistd::geteuid().as_raw()
            && meta.mode() & 0o077 == 0;
        private.then_some(runtime)?
    };
    is_tmpfs(&root).then_some(root)
}

/// Whether `path` is on a tmpfs.
fn is_tmpfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::TMPFS_MAGIC)
}

/// The place recorded in the cluster directory `dir`: its path and the version directory in
/// it. A record that does not read as one (another program's file) is no record.
pub(super) fn recorded(dir: &Path) -> Option<(PathBuf, String)> {
    let text = std::fs::read_to_string(dir.join(RECORD)).ok()?;
    let mut lines = text.lines();
    let place = PathBuf::from(lines.next()?);
    let version = lines.next()?.to_string();
    let named = place.is_absolute()
        && place
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with(PREFIX));
    let version_ok = version.starts_with("PG_")
        && version[3..]
            .split('_')
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    (named && version_ok).then_some((place, version))
}

/// The recorded place of the cluster in `dir` when that place names this cluster back; `None`
/// for a cluster copied with its directory (`cp -a` of a project): the copy's catalog still
/// points at the original's place, where two servers would write the same files, so the
/// copy's branches stay on disk.
pub(super) fn ours(dir: &Path) -> Option<PathBuf> {
    let (place, _) = recorded(dir)?;
    let owner = std::fs::read(place.join(OWNER)).ok()?;
    (owner == dir.as_os_str().as_bytes()).then_some(place)
}

/// Before the server starts: the recorded place's directories made again where a reboot took
/// them. `true` when anything was made again (the server then starts with
/// `ignore_invalid_pages`, see the module doc).
pub(super) fn restore(dir: &Path, run_as: Option<&RunAs>) -> Result<bool> {
    let Some((place, version)) = recorded(dir) else {
        return Ok(false);
    };
    let made = private_dir(&place, run_as)?;
    if made {
        // The whole place went (a reboot): it is this cluster's again.
        write_owner(&place, dir)?;
    }
    let made = private_dir(&place.join(version), run_as)? || made;
    if made {
        info!(place = %place.display(), "the cluster's branches in memory were gone (a reboot); their place is made again");
    }
    Ok(made)
}

/// Makes `dir` (its parent exists) owned by the server's user with mode `0700`, or checks
/// that it is such a directory. `true` when it was made.
fn private_dir(dir: &Path, run_as: Option<&RunAs>) -> Result<bool> {
    let uid = run_as.map_or(nix::unistd::geteuid().as_raw(), |r| r.uid);
    match std::fs::symlink_metadata(dir) {
        Ok(meta) if meta.is_dir() && meta.uid() == uid && meta.mode() & 0o077 == 0 => Ok(false),
        Ok(_) => Err(Error::cluster_io(
            format!("use {} for branches", dir.display()),
            std::io::Error::other("it is not a private directory of the server's user"),
        )),
        // Made with `create_dir`, never `ensure_dir`: in a directory anyone may write
        // (`/dev/shm`), a link planted under this name must fail the make, not be followed
        // and have its target given to the server's user.
        Err(_) => {
            std::fs::create_dir(dir)
                .map_err(|e| Error::cluster_io(format!("create {}", dir.display()), e))?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
                .map_err(|e| Error::cluster_io(format!("chmod {}", dir.display()), e))?;
            if let Some(ra) = run_as {
                ra.chown(dir)?;
            }
            Ok(true)
        }
    }
}

/// After the server is up (under the provider set-up's lock): the cluster's branch tablespace,
/// made once. The place branches go to, or `None` (they stay on disk): a tablespace that
/// cannot be made is said in the log and never fails a run.
pub(crate) async fn ensure(client: &Client, cluster: &EmbeddedCluster) -> Option<PathBuf> {
    let place = cluster.branch_space()?;
    if let Some(root) = place.parent() {
        remove_orphans(root, cluster.run_as());
    }
    match make(client, cluster, place).await {
        Ok(()) => Some(place.to_path_buf()),
        Err(e) => {
            warn!(place = %place.display(), error = %consort_actors::error_chain(&e), "branches stay on disk: their place in memory could not be made");
            None
        }
    }
}

async fn make(client: &Client, cluster: &EmbeddedCluster, place: &Path) -> Result<()> {
    let found = client
        .query_opt(
            "SELECT pg_tablespace_location(oid) FROM pg_tablespace WHERE spcname = $1",
            &[&TABLESPACE],
        )
        .await
        .map_err(|e| Error::from_pg("looking up the branch tablespace", e))?;
    if let Some(row) = found {
        let at: String = row.get(0);
        if Path::new(&at) != place {
            return Err(Error::cluster_io(
                format!("use {}", place.display()),
                std::io::Error::other(format!("the tablespace {TABLESPACE} is at {at}")),
            ));
        }
    } else {
        // Unnamed by any tablespace: what is inside is a former cluster's (this directory's
        // name comes from the cluster's path).
        if !private_dir(place, cluster.run_as())? {
            empty(place)?;
        }
        client
            .batch_execute(&format!(
                "CREATE TABLESPACE {TABLESPACE} LOCATION {}",
                quote_literal(&place.to_string_lossy())
            ))
            .await
            .map_err(|e| Error::from_pg("making the branch tablespace", e))?;
        info!(place = %place.display(), "branches are made in memory");
    }
    if ours(cluster.dir()).as_deref() != Some(place) {
        record(cluster, place)?;
    }
    Ok(())
}

/// Removes the places in `root` whose cluster directory is gone (its project was deleted):
/// memory no one would ever give back otherwise. Only a place of the server's user that names
/// its cluster directory ([`OWNER`]) is ever removed.
fn remove_orphans(root: &Path, run_as: Option<&RunAs>) {
    let uid = run_as.map_or(nix::unistd::geteuid().as_raw(), |r| r.uid);
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let place = e.path();
        let ours = e.file_name().to_string_lossy().starts_with(PREFIX)
            && std::fs::symlink_metadata(&place).is_ok_and(|m| m.is_dir() && m.uid() == uid);
        let Some(cluster) = ours
            .then(|| std::fs::read(place.join(OWNER)).ok())
            .flatten()
            .map(|b| PathBuf::from(std::ffi::OsString::from_vec(b)))
        else {
            continue;
        };
        if cluster.is_absolute() && std::fs::symlink_metadata(&cluster).is_err() {
            match std::fs::remove_dir_all(&place) {
                Ok(()) => {
                    info!(place = %place.display(), cluster = %cluster.display(), "removed the branches in memory of a cluster that is gone")
                }
                Err(e) => {
                    warn!(place = %place.display(), error = %e, "could not remove the branches in memory of a cluster that is gone")
                }
            }
        }
    }
}

/// Removes what is inside `dir`.
fn empty(dir: &Path) -> Result<()> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| Error::cluster_io(format!("read {}", dir.display()), e))?;
    for e in entries.flatten() {
        let p = e.path();
        let gone = if p.is_dir() && !p.is_symlink() {
            std::fs::remove_dir_all(&p)
        } else {
            std::fs::remove_file(&p)
        };
        gone.map_err(|e| Error::cluster_io(format!("remove {}", p.display()), e))?;
    }
    Ok(())
}

/// Writes the record of `place` (with the version directory the server made in it).
fn record(cluster: &EmbeddedCluster, place: &Path) -> Result<()> {
    let version = std::fs::read_dir(place)
        .map_err(|e| Error::cluster_io(format!("read {}", place.display()), e))?
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.starts_with("PG_"))
        .ok_or_else(|| {
            Error::cluster_io(
                format!("read {}", place.display()),
                std::io::Error::other("the server made no version directory there"),
            )
        })?;
    // The owner first: a record always names a place that names its cluster back.
    write_owner(place, cluster.dir())?;
    write_private(
        &cluster.dir().join(RECORD),
        &format!("{}\n{version}\n", place.display()),
        cluster.run_as(),
    )
}

/// Writes into `place` the cluster directory `dir` it belongs to ([`OWNER`]).
fn write_owner(place: &Path, dir: &Path) -> Result<()> {
    let owner = place.join(OWNER);
    std::fs::write(&owner, dir.as_os_str().as_bytes())
        .map_err(|e| Error::cluster_io(format!("write {}", owner.display()), e))
}

/// Whether the memory at `place` has room for a branch of a base of `base_bytes`.
pub(crate) fn has_room(place: &Path, base_bytes: u64) -> bool {
    nix::sys::statvfs::statvfs(place).is_ok_and(|s| {
        let free = s.blocks_available() * s.fragment_size();
        free >= base_bytes.saturating_mul(2).saturating_add(SPARE_BYTES)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_read_only_when_it_names_a_place_of_ours() {
        let dir = tempfile::tempdir().expect("dir");
        let write = |text: &str| std::fs::write(dir.path().join(RECORD), text).expect("write");
        write("/dev/shm/consort-branches-0123456789abcdef\nPG_15_202209061\n");
        assert_eq!(
            recorded(dir.path()),
            Some((
                PathBuf::from("/dev/shm/consort-branches-0123456789abcdef"),
                "PG_15_202209061".to_string()
            ))
        );
        for bad in [
            "/etc\nPG_15_202209061\n",
            "relative/consort-branches-x\nPG_15_1\n",
            "/dev/shm/consort-branches-x\n../../etc\n",
            "/dev/shm/consort-branches-x\nPG_15_\n",
            "/dev/shm/consort-branches-x\n",
        ] {
            write(bad);
            assert_eq!(recorded(dir.path()), None, "{bad:?}");
        }
    }

    #[test]
    fn a_place_is_made_private_and_an_unsafe_one_is_refused() {
        let dir = tempfile::tempdir().expect("dir");
        let place = dir.path().join("space");
        assert!(private_dir(&place, None).expect("made"), "made");
        let mode = std::fs::metadata(&place).expect("meta").mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(
            !private_dir(&place, None).expect("there"),
            "found, not made"
        );
        std::fs::set_permissions(&place, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        assert!(private_dir(&place, None).is_err(), "open to others");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&place, &link).expect("symlink");
        assert!(private_dir(&link, None).is_err(), "a link is never a place");
    }

    #[test]
    fn a_place_is_on_a_tmpfs_or_nowhere() {
        if let Some(place) = place_for(Path::new("/some/project/.consort/pg")) {
            assert!(is_tmpfs(place.parent().expect("parent")));
            assert!(
                place
                    .file_name()
                    .expect("name")
                    .to_string_lossy()
                    .starts_with(PREFIX)
            );
        }
        assert!(!is_tmpfs(Path::new("/nonexistent/consort")));
    }

    #[test]
    fn only_places_whose_cluster_is_gone_are_removed() {
        let root = tempfile::tempdir().expect("root");
        let live = tempfile::tempdir().expect("a live cluster");
        let place = |name: &str, owner: Option<&Path>| {
            let p = root.path().join(name);
            std::fs::create_dir_all(p.join("PG_15_1")).expect("place");
            if let Some(o) = owner {
                std::fs::write(p.join(OWNER), o.as_os_str().as_bytes()).expect("owner");
            }
            p
        };
        let gone = place(
            "consort-branches-1",
            Some(Path::new("/nonexistent/consort/pg")),
        );
        let kept = place("consort-branches-2", Some(live.path()));
        let unnamed = place("consort-branches-3", None);
        let foreign = place("other-4", Some(Path::new("/nonexistent/consort/pg")));
        remove_orphans(root.path(), None);
        assert!(!gone.exists(), "its cluster is gone");
        for p in [kept, unnamed, foreign] {
            assert!(p.exists(), "{} is kept", p.display());
        }
    }

    #[test]
    fn room_counts_twice_the_base_and_the_spare() {
        let dir = tempfile::tempdir().expect("dir");
        assert!(
            !has_room(dir.path(), u64::MAX / 2),
            "no file system has that"
        );
        assert!(!has_room(Path::new("/nonexistent/consort"), 0));
    }
}
