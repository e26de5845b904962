//! The JSON marker comment on every database and role Consort creates.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::procinfo;
use crate::provider::BaseRef;

/// The marker comment on everything Consort creates.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Meta {
    consort: u8,
    pub(super) base: Option<String>,
    pub(super) key: Option<String>,
    /// Seconds since the Unix epoch (negative only on a clock set before 1970).
    pub(super) created: i64,
    pub(super) pid: u32,
    ticks: u64,
    boot: String,
    host: String,
    pub(super) kept_until: Option<i64>,
}

/// Seconds since the Unix epoch, now.
pub(super) fn unix_now() -> i64 {
    unix_secs(SystemTime::now())
}

/// Seconds since the Unix epoch of `t` (negative before 1970: no fallback value).
pub(super) fn unix_secs(t: SystemTime) -> i64 {
    chrono::DateTime::<chrono::Utc>::from(t).timestamp()
}

impl Meta {
    /// The marker of this process, now, for something made from `base`. An error when this
    /// process cannot describe itself: a marker without its start time, boot or host would let
    /// a sweeper take a live branch for an orphan (or never see an orphan).
    pub(super) fn now(base: Option<&BaseRef>) -> Result<Self> {
        let unknown = |what| Error::Unsupported(format!("{what} is not readable from /proc"));
        let (pid, ticks) = procinfo::me().ok_or_else(|| unknown("this process's start time"))?;
        Ok(Meta {
            consort: 1,
            base: base.map(|b| b.id.clone()),
            key: base.map(|b| b.key.to_hex()),
            created: unix_now(),
            pid,
            ticks,
            boot: procinfo::boot_id().ok_or_else(|| unknown("the boot id"))?,
            host: procinfo::hostname().ok_or_else(|| unknown("the host name"))?,
            kept_until: None,
        })
    }

    /// The marker in a comment; `None` when the comment is not one of ours.
    pub(super) fn parse(comment: Option<&str>) -> Option<Meta> {
        let m: Meta = serde_json::from_str(comment?).ok()?;
        (m.consort == 1).then_some(m)
    }

    /// The comment text. An error (never an empty marker: a branch without its marker would
    /// never be swept).
    pub(super) fn text(&self) -> Result<String> {
        serde_json::to_string(self).map_err(|source| Error::Encode {
            what: "a branch marker",
            source,
        })
    }

    /// Whether the creating process is known to be gone (same host: other boot or dead pid).
    /// When this host's name or boot cannot be read, nothing is known to be gone.
    pub(super) fn owner_gone(&self) -> bool {
        let (Some(host), Some(boot)) = (procinfo::hostname(), procinfo::boot_id()) else {
            return false;
        };
        self.host == host
            && (self.boot != boot || !procinfo::same_process_alive(self.pid, self.ticks))
    }

    /// When it was created.
    pub(super) fn created_at(&self) -> SystemTime {
        match u64::try_from(self.created) {
            Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs),
            Err(_) => UNIX_EPOCH - Duration::from_secs(self.created.unsigned_abs()),
        }
    }
}
