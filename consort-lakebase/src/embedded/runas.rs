//! Running the server as an unprivileged user when this process is root.
//!
//! PostgreSQL refuses to run as root. When Consort runs as root, `initdb` and `postgres` run as
//! an unprivileged system user (`postgres` by default) and the cluster directory is owned by it.
//! That user must be able to reach the directory: a location below a `0700` directory of root
//! (such as `/root/...` or a root-owned temporary directory) is not reachable, and the cluster is
//! then placed under `/tmp/consort-pg-<hash of the requested path>` instead.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::error::{ClusterError, Error, Result};

/// The unprivileged identity the server runs as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunAs {
    /// The user name.
    pub name: String,
    /// Its uid.
    pub uid: u32,
    /// Its primary gid.
    pub gid: u32,
}

fn no_such(user: &str) -> Error {
    ClusterError::NoSuchUser {
        user: user.to_string(),
    }
    .into()
}

/// The server's user unless one is configured.
pub(super) const DEFAULT_USER: &str = "postgres";

/// The server's user when [`DEFAULT_USER`] does not exist (a machine without the PostgreSQL
/// package): present on nearly every Linux system.
const FALLBACK_USER: &str = "nobody";

impl RunAs {
    /// The identity to use: `Some(user)` when this process is root, `None` otherwise (the
    /// server then runs as the current user). The default user, `postgres`, falls back to
    /// `nobody` where it does not exist; a configured user that does not exist is an error.
    pub fn for_current_process(user: &str) -> Result<Option<RunAs>> {
        if !nix::unistd::geteuid().is_root() {
            return Ok(None);
        }
        let fallback = (user == DEFAULT_USER).then_some(FALLBACK_USER);
        Self::named(user, fallback).map(Some)
    }

    /// `user`, or `fallback` when `user` does not exist.
    fn named(user: &str, fallback: Option<&str>) -> Result<RunAs> {
        let lookup = |name: &str| {
            nix::unistd::User::from_name(name).map_err(|source| ClusterError::UserLookup {
                user: name.to_string(),
                source,
            })
        };
        let (name, found) = match (lookup(user)?, fallback) {
            (Some(found), _) => (user, found),
            (None, Some(other)) => match lookup(other)? {
                Some(found) => {
                    tracing::info!(user, other, "no such user; the server runs as the fallback");
                    (other, found)
                }
                None => return Err(no_such(user)),
            },
            (None, None) => return Err(no_such(user)),
        };
        let user = name;
        if found.uid.is_root() {
            return Err(ClusterError::RootUser {
                user: user.to_string(),
            }
            .into());
        }
        Ok(RunAs {
            name: user.to_string(),
            uid: found.uid.as_raw(),
            gid: found.gid.as_raw(),
        })
    }

    /// Whether this user may traverse every existing ancestor of `path` (and use `path` itself
    /// when it exists).
    pub fn can_reach(&self, path: &Path) -> bool {
        let mut ok = true;
        for dir in path.ancestors().collect::<Vec<_>>().into_iter().rev() {
            let Ok(meta) = std::fs::metadata(dir) else {
                break;
            };
            let mode = meta.permissions().mode();
            let bits = if meta.uid() == self.uid {
                (mode >> 6) & 0o7
            } else if meta.gid() == self.gid {
                (mode >> 3) & 0o7
            } else {
                mode & 0o7
            };
            let needed = if dir == path { 0o7 } else { 0o1 };
            // The directory itself we create or chown ourselves; only its ancestors must be
            // traversable by the user.
            if dir == path && meta.uid() != self.uid {
                continue;
            }
            if bits & needed != needed {
                ok = false;
                break;
            }
        }
        ok
    }

    /// Gives `path` to this user.
    pub fn chown(&self, path: &Path) -> Result<()> {
        std::os::unix::fs::chown(path, Some(self.uid), Some(self.gid))
            .map_err(|e| Error::cluster_io(format!("chown {} to {}", path.display(), self.name), e))
    }
}

/// The fallback location for a requested cluster directory the server user cannot reach.
pub fn fallback_dir(requested: &Path) -> PathBuf {
    let digest = Sha256::digest(requested.to_string_lossy().as_bytes());
    PathBuf::from("/tmp").join(format!("consort-pg-{}", &hex::encode(digest)[..16]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unreachable_ancestors_are_detected() {
        let Some(pg) = RunAs::for_current_process("postgres").expect("lookup") else {
            return; // not root: nothing to check here
        };
        let root_only = std::env::temp_dir().join(format!("consort-reach-{}", std::process::id()));
        std::fs::create_dir_all(&root_only).expect("mkdir");
        std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        assert!(!pg.can_reach(&root_only.join("pg")));
        std::fs::set_permissions(&root_only, std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        assert!(pg.can_reach(&root_only.join("pg")));
        std::fs::remove_dir_all(&root_only).expect("cleanup");
        assert_eq!(
            fallback_dir(Path::new("/root/x")),
            fallback_dir(Path::new("/root/x"))
        );
        assert_ne!(
            fallback_dir(Path::new("/root/x")),
            fallback_dir(Path::new("/root/y"))
        );
    }

    #[test]
    fn the_default_user_falls_back_where_it_does_not_exist_and_a_configured_one_does_not() {
        let missing = "consort-no-such-user";
        let used = RunAs::named(missing, Some("nobody")).expect("falls back");
        assert_eq!(used.name, "nobody");
        assert_ne!(used.uid, 0);
        let err = RunAs::named(missing, None).expect_err("no fallback for a configured user");
        assert!(err.to_string().contains(missing), "{err}");
        let err = RunAs::named(missing, Some("consort-nor-this")).expect_err("neither exists");
        assert!(err.to_string().contains(missing), "{err}");
        assert!(RunAs::named("root", None).is_err(), "never root");
    }
}
