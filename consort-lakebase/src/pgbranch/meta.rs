//! The JSON marker comment on every database and role Consort creates, and how a sweeper
//! tells that the process which made it is gone: on its own host by its pid and start time;
//! from any host by the shared advisory lock every administrator session of a provider holds
//! ([`Liveness`]).

use std::collections::HashSet;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;

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
    /// The key of the provider's liveness lock (absent in markers of older versions).
    #[serde(default)]
    live: Option<u32>,
}

/// The first key of the two-key advisory locks that say a provider is alive ("cons"); the
/// second is the provider's own random key. Shared locks: every administrator session of one
/// provider holds it, and a lock ends with its session, so with a killed process.
pub(super) const LIVE_CLASS: i32 = 0x636f_6e73;

/// The liveness keys held on the server now.
#[derive(Debug, Default)]
pub(super) struct Liveness(HashSet<u32>);

impl Liveness {
    /// Reads the liveness locks held on the server (`pg_locks` is readable by every role).
    pub(super) async fn read(admin: &Client) -> Result<Liveness> {
        let rows = admin
            .query(
                "SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' \
                 AND classid = $1::int4::oid AND objsubid = 2 AND granted",
                &[&LIVE_CLASS],
            )
            .await
            .map_err(|e| Error::from_pg("reading which providers are alive", e))?;
        Ok(Liveness(
            rows.iter()
                .filter_map(|r| u32::try_from(r.get::<_, i64>(0)).ok())
                .collect(),
        ))
    }

    /// Whether the provider with liveness key `key` holds a session on the server.
    pub(super) fn holds(&self, key: u32) -> bool {
        self.0.contains(&key)
    }
}

/// Takes the shared liveness lock `key` on session `c` (held until the session ends).
pub(super) async fn hold_live(c: &Client, key: u32) -> Result<()> {
    // Two int4 keys: the second is the key's bits, as `pg_locks.objid` shows them.
    let second = i32::from_ne_bytes(key.to_ne_bytes());
    c.execute(
        "SELECT pg_advisory_lock_shared($1, $2)",
        &[&LIVE_CLASS, &second],
    )
    .await
    .map_err(|e| Error::from_pg("taking the provider's liveness lock", e))?;
    Ok(())
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
    /// The marker of this process (a provider with liveness key `live`), now, for something
    /// made from `base`. An error when this
    /// process cannot describe itself: a marker without its start time, boot or host would let
    /// a sweeper take a live branch for an orphan (or never see an orphan).
    pub(super) fn now(base: Option<&BaseRef>, live: u32) -> Result<Self> {
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
            live: Some(live),
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

    /// Whether the creating process is known to be gone. On its own host: another boot, or
    /// its pid no longer names it. From another host: its provider holds no liveness lock
    /// (`live`); a marker without a liveness key is never known to be gone from elsewhere.
    pub(super) fn owner_gone(&self, live: &Liveness) -> bool {
        self.gone_here()
            .unwrap_or_else(|| self.live.is_some_and(|k| !live.holds(k)))
    }

    /// Whether the process that made it is gone, as this host knows it: None when it ran on
    /// another host (or this one cannot describe itself).
    fn gone_here(&self) -> Option<bool> {
        match (procinfo::hostname(), procinfo::boot_id()) {
            (Some(host), Some(boot)) if host == self.host => {
                Some(self.boot != boot || !procinfo::same_process_alive(self.pid, self.ticks))
            }
            _ => None,
        }
    }

    /// The liveness key of its maker when this host knows the maker is gone while the server
    /// still holds the key: sessions that outlive a killed process, busy with a statement it
    /// sent before it died.
    pub(super) fn outlived_key(&self, live: &Liveness) -> Option<u32> {
        let key = self.live?;
        (live.holds(key) && self.gone_here() == Some(true)).then_some(key)
    }

    /// When it was created.
    pub(super) fn created_at(&self) -> SystemTime {
        match u64::try_from(self.created) {
            Ok(secs) => UNIX_EPOCH + Duration::from_secs(secs),
            Err(_) => UNIX_EPOCH - Duration::from_secs(self.created.unsigned_abs()),
        }
    }
}
