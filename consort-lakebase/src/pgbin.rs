//! Finding the PostgreSQL server binaries (`initdb`, `postgres`) and `psql`.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};

/// Where the PostgreSQL programs live.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgBinaries {
    /// The directory holding `initdb` and `postgres`.
    pub bin_dir: PathBuf,
}

fn is_executable(p: &Path) -> bool {
    p.metadata()
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        // A path that cannot be inspected is not a usable program.
        .unwrap_or(false)
}

fn has_server(dir: &Path) -> bool {
    is_executable(&dir.join("initdb")) && is_executable(&dir.join("postgres"))
}

fn path_dirs() -> Vec<PathBuf> {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect())
        // No PATH: no directories to search (the other places are still searched).
        .unwrap_or_default()
}

/// The `/usr/lib/postgresql/<major>/bin` directories, newest major first.
fn debian_dirs() -> Vec<PathBuf> {
    let mut found: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter_map(|e| {
                    let major = e.file_name().to_string_lossy().parse::<u32>().ok()?;
                    Some((major, e.path().join("bin")))
                })
                .collect()
        })
        // No Debian-style installation: nothing found here (PATH is searched as well).
        .unwrap_or_default();
    found.sort_by_key(|f| std::cmp::Reverse(f.0));
    found.into_iter().map(|(_, p)| p).collect()
}

fn pg_config_bindir() -> Option<PathBuf> {
    let out = Command::new("pg_config").arg("--bindir").output().ok()?;
    if !out.status.success() {
        return None;
    }
    let dir = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!dir.is_empty()).then(|| PathBuf::from(dir))
}

impl PgBinaries {
    /// Finds the server binaries: `explicit` when given, else `PATH`, `pg_config --bindir`,
    /// then `/usr/lib/postgresql/*/bin` (newest first). A clear error names what to install.
    pub fn find(explicit: Option<&Path>) -> Result<Self> {
        if let Some(dir) = explicit {
            return if has_server(dir) {
                Ok(PgBinaries {
                    bin_dir: dir.to_path_buf(),
                })
            } else {
                Err(Error::BinariesNotFound(format!(
                    "{} has no initdb and postgres",
                    dir.display()
                )))
            };
        }
        let mut candidates = path_dirs();
        candidates.extend(pg_config_bindir());
        candidates.extend(debian_dirs());
        candidates
            .into_iter()
            .find(|d| has_server(d))
            .map(|bin_dir| PgBinaries { bin_dir })
            .ok_or_else(|| {
                Error::BinariesNotFound(
                    "looked in PATH, `pg_config --bindir` and /usr/lib/postgresql/*/bin".into(),
                )
            })
    }

    /// The `initdb` program.
    pub fn initdb(&self) -> PathBuf {
        self.bin_dir.join("initdb")
    }

    /// The `postgres` server program.
    pub fn postgres(&self) -> PathBuf {
        self.bin_dir.join("postgres")
    }

    /// The `psql` client: beside the server binaries, else on `PATH`.
    pub fn psql(&self) -> Result<PathBuf> {
        let here = self.bin_dir.join("psql");
        if is_executable(&here) {
            return Ok(here);
        }
        find_psql()
    }
}

/// Finds `psql` on `PATH`, then beside the server binaries.
pub fn find_psql() -> Result<PathBuf> {
    let mut dirs = path_dirs();
    dirs.extend(pg_config_bindir());
    dirs.extend(debian_dirs());
    dirs.into_iter()
        .map(|d| d.join("psql"))
        .find(|p| is_executable(p))
        .ok_or_else(|| {
            Error::Runner(
                "psql not found on PATH or in /usr/lib/postgresql/*/bin; install it, e.g. `apt-get install postgresql-client`"
                    .into(),
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_installed_server_and_names_the_package_when_missing() {
        let bins = PgBinaries::find(None).expect("PostgreSQL is installed on this machine");
        assert!(is_executable(&bins.initdb()));
        assert!(is_executable(&bins.postgres()));
        assert!(is_executable(&bins.psql().expect("psql")));
        let empty = std::env::temp_dir();
        let err = PgBinaries::find(Some(&empty)).expect_err("no binaries there");
        assert!(
            err.to_string().contains("apt-get install postgresql"),
            "{err}"
        );
    }
}
