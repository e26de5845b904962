//! The records machines share, in PostgreSQL: each feature's ledger (its hash chain, row by
//! row) and each feature's lease.
//!
//! A process on any machine that names the same database sees the same ledgers. What makes
//! that safe is taken from the systems that coordinate workers through PostgreSQL alone
//! (river, graphile-worker, Oban): row locks and one transaction per change, no server of our
//! own.
//!
//! - **An event takes effect once its row is committed.** [`PgStore::append`] locks the
//!   feature's lease row, then reads the chain's last entry in a statement of its own (whose
//!   snapshot is taken after the lock is held, so it sees every append committed before), writes
//!   the next one (the same line the file ledger writes, [`consort_actors::entry_line`]) and
//!   commits: two appenders of one feature, on any machines, are serialised by the row lock,
//!   and the primary key refuses a sequence number written twice.
//! - **Leases and fencing.** A process drives a feature only while it holds the feature's
//!   lease ([`PgStore::acquire`], [`PgStore::renew`]); a lease not renewed in time expires,
//!   and the next taker gets a token one higher. Every append a driver makes carries its
//!   token ([`Fence::Lease`]), checked under the same row lock: a process that lost its lease
//!   (killed, cut off, paused) can write nothing more. A person's decision (an approval, a
//!   retry, a stop) carries none ([`Fence::Person`]): the state machine judges it, and it ends
//!   the lease of whoever drives the feature in the same transaction, so that process's next
//!   append, renewal, push or promotion is refused (within one step, and at most a third of
//!   `lease_seconds` for its renewal thread to notice) and the next to take the feature over
//!   replays the decision.
//! - **Untrusted rows.** Every row read is checked as a file ledger's line is
//!   ([`consort_actors::verify_line`]: its sequence, its link to the previous entry, its hash,
//!   its event), and its stored hash must be the line's; a bad or foreign row is refused with
//!   the feature and sequence number, never half-read.
//! - **Beside the ledgers** (`records`): the backlog's order, each feature's small record
//!   files (its request, its lane's record) and who holds which lease since when, so that a
//!   clone on any machine sees the project as every other does.
//! - **A versioned schema.** [`PgStore::connect`] creates the schema `consort_store` or brings
//!   it to this version, under an advisory lock; a schema a newer Consort made is refused.

use std::time::Duration;

use chrono::{SubsecRound, Utc};
use consort_actors::{ContentHash, Entry, Event, LedgerError, genesis};
use tokio_postgres::{Client, Transaction};

use crate::provider::ConnectInfo;

/// The largest ledger row read: the file ledger's cap on a line.
const MAX_LINE: usize = consort_actors::DEFAULT_MAX_LINE_BYTES;

mod blocking;
mod records;

pub use blocking::{PgEventLog, PgEventLogOpener, StoreHandle};
pub use records::{Holding, MAX_DOCUMENT_BYTES};

/// The schema's migrations, in order; the schema's version is how many have been applied.
const MIGRATIONS: [&str; 3] = [
    r"
CREATE TABLE consort_store.leases (
    project text NOT NULL,
    feature text NOT NULL,
    holder text,
    token bigint NOT NULL DEFAULT 0,
    expires_at timestamptz,
    PRIMARY KEY (project, feature)
);
CREATE TABLE consort_store.events (
    project text NOT NULL,
    feature text NOT NULL,
    seq bigint NOT NULL CHECK (seq > 0),
    hash text NOT NULL,
    line text NOT NULL,
    PRIMARY KEY (project, feature, seq)
);
",
    r"
ALTER TABLE consort_store.leases ADD COLUMN since timestamptz;
CREATE TABLE consort_store.backlog (
    project text NOT NULL,
    position integer NOT NULL,
    feature text NOT NULL,
    PRIMARY KEY (project, feature),
    UNIQUE (project, position)
);
CREATE TABLE consort_store.documents (
    project text NOT NULL,
    feature text NOT NULL,
    name text NOT NULL,
    body text NOT NULL,
    PRIMARY KEY (project, feature, name)
);
",
    // How many of the feature's holders in a row were lost (their lease ran out while held):
    // the fleet's bound on a feature that kills its workers.
    r"
ALTER TABLE consort_store.leases ADD COLUMN lost integer NOT NULL DEFAULT 0;
",
];

/// How many workers in a row a feature may lose (their lease ran out while they held it:
/// killed, out of memory, cut off) before the fleet stops taking it over and it waits for a
/// person. Each takeover also waits longer: `lease_seconds × (2^lost − 1)` past the lost
/// lease's end.
pub const LOST_WORKERS_BOUND: i32 = 3;

/// Why the store could not be used, or refused a change.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The database could not be reached or refused a statement.
    #[error("the store's database: {context}")]
    Database {
        /// What was being done.
        context: String,
        /// The driver's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The connection could not be made.
    #[error(transparent)]
    Connect(#[from] crate::Error),
    /// The schema was made by a newer Consort.
    #[error(
        "the store's schema is at version {found}, newer than this Consort knows ({known}): upgrade Consort on this machine"
    )]
    NewerSchema {
        /// The version found.
        found: i32,
        /// The newest this code knows.
        known: i32,
    },
    /// A row of a feature's ledger is not the next entry of its chain.
    #[error("the store's ledger of feature {feature}, entry {seq}: {reason}")]
    BadRow {
        /// The feature.
        feature: String,
        /// The row's sequence number.
        seq: i64,
        /// What is wrong with it.
        reason: String,
    },
    /// An append carried a lease that is no longer the feature's.
    #[error(
        "feature {feature} is no longer driven by this process: its lease (token {token}) {why}; another process may have taken it over, and nothing was recorded"
    )]
    StaleLease {
        /// The feature.
        feature: String,
        /// The token the append carried.
        token: i64,
        /// Why it no longer holds.
        why: String,
    },
    /// A person's decision was judged on fewer entries than the ledger holds by now: a process
    /// appended after the decision's command read the ledger.
    #[error(
        "the ledger of feature {feature} moved on while the decision was being made (it was judged on {seen} entries; the ledger now holds {now}); nothing was recorded: look at the run again (`consort status`) and decide anew"
    )]
    MovedOn {
        /// The feature.
        feature: String,
        /// How many entries the decision was judged on.
        seen: u64,
        /// How many the ledger holds.
        now: u64,
    },
    /// The store's own thread could not start or ended.
    #[error("the store's thread: {0}")]
    Thread(String),
    /// The event could not be written as a ledger line.
    #[error("the event cannot be recorded")]
    Event(#[from] LedgerError),
}

/// A process's hold on one feature: while it lasts, only this process drives the feature.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The feature.
    pub feature: String,
    /// Who holds it (a process on a machine, as people read it).
    pub holder: String,
    /// The fencing token: one higher for each new holder of the feature.
    pub token: i64,
}

/// Who an append is made for.
#[derive(Debug, Clone, Copy)]
pub enum Fence<'a> {
    /// The process that drives the feature, under its lease.
    Lease(&'a Lease),
    /// A person's decision, judged by the state machine whoever drives; it ends the lease of
    /// the process that drives the feature, if one does.
    Person,
    /// A person's decision as [`Fence::Person`], judged on the ledger's first `seen` entries:
    /// refused ([`StoreError::MovedOn`]) when the ledger holds more by now, so a decision is
    /// never recorded after entries it was not judged on (what `consort stop`, `retry`,
    /// `approve` and `test` append, through [`PgEventLog`]).
    PersonJudgedOn {
        /// How many entries the decision was judged on.
        seen: u64,
    },
}

/// A connection to the shared store of one project.
pub struct PgStore {
    client: Client,
    project: String,
    /// Where it connected, to connect again after the connection is lost.
    info: ConnectInfo,
    /// Whether this connection took the project's merge lock and has not given it back.
    merge_held: bool,
    /// Whether a merge lock this store held went with a lost connection (the server gave it
    /// up when the session ended; another machine may merge now).
    merge_lost: bool,
}

/// What every session of the store sets: a statement waits at most this long for a lock, runs
/// at most this long, and a transaction left idle (its process paused or cut off inside an
/// append, holding the feature's lease row) is ended by the server after a second, so the
/// feature can be taken over when its lease runs out.
const SESSION: &str = "SET lock_timeout = '10s'; SET statement_timeout = '60s'; \
     SET idle_in_transaction_session_timeout = '1s'";

/// How long [`PgStore::reconnect`] keeps trying, in all.
const RECONNECT_FOR: Duration = Duration::from_secs(15);

impl std::fmt::Debug for PgStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgStore")
            .field("project", &self.project)
            .finish_non_exhaustive()
    }
}

fn db(context: impl Into<String>) -> impl FnOnce(tokio_postgres::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Database { context, source }
}

impl PgStore {
    /// A transaction on the store's connection, and the project it is for; `what` names the
    /// work in an error.
    async fn begin(&mut self, what: &str) -> Result<(String, Transaction<'_>), StoreError> {
        let project = self.project.clone();
        let tx = self.client.transaction().await.map_err(db(what))?;
        Ok((project, tx))
    }

    /// Connects to the store's database as `info` says, for the records of `project`, and
    /// brings the schema to this version.
    pub async fn connect(info: &ConnectInfo, project: &str) -> Result<PgStore, StoreError> {
        let mut client = crate::pgconn::connect(info).await?;
        // Named by process, so that `pg_stat_activity` says whose session holds what.
        let named = format!(
            "{SESSION}; SET application_name = 'consort-store:{}'",
            std::process::id()
        );
        client
            .batch_execute(&named)
            .await
            .map_err(db("setting the session's time limits"))?;
        migrate(&mut client).await?;
        Ok(PgStore {
            client,
            project: project.to_string(),
            info: info.clone(),
            merge_held: false,
            merge_lost: false,
        })
    }

    /// A setting of this store's session as the server reports it (`SHOW name`): what a
    /// statement of the store runs under, for diagnosis.
    pub async fn session_setting(&self, name: &str) -> Result<String, StoreError> {
        let row = self
            .client
            .query_one("SELECT current_setting($1)", &[&name])
            .await
            .map_err(db(format!("reading the setting {name}")))?;
        Ok(row.get(0))
    }

    /// Whether the connection is gone (the server ended it, or the network did).
    pub fn is_closed(&self) -> bool {
        self.client.is_closed()
    }

    /// Connects again after the connection was lost, trying for a while with a growing pause;
    /// a merge lock the lost connection held is then lost ([`PgStore::merge_lock_intact`]).
    pub async fn reconnect(&mut self) -> Result<(), StoreError> {
        let started = std::time::Instant::now();
        let mut pause = Duration::from_millis(100);
        loop {
            match PgStore::connect(&self.info, &self.project).await {
                Ok(fresh) => {
                    tracing::warn!(project = %self.project, "the store's connection was lost and is made again");
                    let lost = self.merge_held || self.merge_lost;
                    *self = PgStore {
                        merge_lost: lost,
                        ..fresh
                    };
                    return Ok(());
                }
                Err(e) if started.elapsed() >= RECONNECT_FOR => return Err(e),
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
            }
        }
    }

    /// Every entry of `feature`'s ledger, oldest first, each row checked.
    pub async fn entries(&self, feature: &str) -> Result<Vec<Entry<Event>>, StoreError> {
        // A line over the file ledger's cap is never sent: only its length is.
        let rows = self
            .client
            .query(
                "SELECT seq, hash, CASE WHEN octet_length(line) <= $3::int8 THEN line END, \
                     octet_length(line) \
                 FROM consort_store.events \
                 WHERE project = $1 AND feature = $2 ORDER BY seq",
                &[&self.project, &feature, &(MAX_LINE as i64)],
            )
            .await
            .map_err(db(format!("reading the ledger of {feature}")))?;
        let mut entries = Vec::with_capacity(rows.len());
        let mut prev = genesis();
        for (i, row) in rows.iter().enumerate() {
            let seq: i64 = row.get(0);
            let line: String =
                row.get::<_, Option<String>>(2)
                    .ok_or_else(|| StoreError::BadRow {
                        feature: feature.to_string(),
                        seq,
                        reason: format!(
                            "its line is {} bytes, more than the ledger's {MAX_LINE}",
                            row.get::<_, i32>(3)
                        ),
                    })?;
            let entry = checked_row(feature, seq, row.get(1), line, i as u64 + 1, &prev)?;
            prev = entry.hash;
            entries.push(entry);
        }
        Ok(entries)
    }

    /// Appends `event` to `feature`'s ledger, after whatever is there, for `fence`; returns
    /// the entry once its row is committed. A stale lease records nothing.
    pub async fn append(
        &mut self,
        feature: &str,
        event: &Event,
        fence: Fence<'_>,
    ) -> Result<Entry<Event>, StoreError> {
        let (project, tx) = self.begin("starting an append").await?;
        let last = match lock_lease_row(&tx, &project, feature, fence).await {
            Ok(last) => last,
            Err(e) => {
                // Rolled back now (see `take_next`), the lease row's lock given up at once.
                let _ = tx.rollback().await;
                return Err(e);
            }
        };
        let (seq, prev) = match last {
            None => (1, genesis()),
            Some((seq, hash)) => {
                let hash = hash
                    .parse::<ContentHash>()
                    .map_err(|_| StoreError::BadRow {
                        feature: feature.to_string(),
                        seq,
                        reason: "its hash is not 64 hex digits".into(),
                    })?;
                (seq + 1, hash)
            }
        };
        let time = Utc::now().trunc_subsecs(6);
        let next = seq_number(feature, seq)?;
        let (line, hash) = consort_actors::entry_line(event, next, prev, time)?;
        tx.execute(
            "INSERT INTO consort_store.events (project, feature, seq, hash, line) \
             VALUES ($1, $2, $3, $4, $5)",
            &[&project, &feature, &seq, &hash.to_hex(), &line],
        )
        .await
        .map_err(db(format!("appending to the ledger of {feature}")))?;
        tx.commit()
            .await
            .map_err(db(format!("committing an append to {feature}")))?;
        Ok(Entry {
            seq: next,
            time,
            prev,
            hash,
            event: event.clone(),
        })
    }

    /// Where each of `features`' chains ends (its last entry's number and hash), in one
    /// statement that reads one index entry per feature: what a scheduler compares with what
    /// it replayed before, instead of reading every chain again. A feature without entries is
    /// left out.
    pub async fn heads(
        &self,
        features: &[String],
    ) -> Result<Vec<(String, i64, String)>, StoreError> {
        let rows = self
            .client
            .query(
                "SELECT f, h.seq, h.hash FROM unnest($2::text[]) AS f, LATERAL \
                 (SELECT seq, hash FROM consort_store.events \
                  WHERE project = $1 AND feature = f ORDER BY seq DESC LIMIT 1) AS h",
                &[&self.project, &features],
            )
            .await
            .map_err(db("reading where the features' ledgers end"))?;
        Ok(rows
            .iter()
            .map(|r| (r.get(0), r.get(1), r.get(2)))
            .collect())
    }

    /// Takes `feature`'s lease for `holder` for `ttl`, when no one holds it or its holder's
    /// time ran out (the token is then one higher); None while another holds it.
    pub async fn acquire(
        &self,
        feature: &str,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let row = self
            .client
            .query_opt(
                "INSERT INTO consort_store.leases AS l \
                 (project, feature, holder, token, since, expires_at) \
                 VALUES ($1, $2, $3, 1, clock_timestamp(), \
                     clock_timestamp() + make_interval(secs => $4)) \
                 ON CONFLICT (project, feature) DO UPDATE \
                 SET holder = EXCLUDED.holder, token = l.token + 1, since = EXCLUDED.since, \
                     expires_at = EXCLUDED.expires_at, lost = 0 \
                 WHERE l.holder IS NULL OR l.expires_at <= clock_timestamp() \
                 RETURNING token",
                &[&self.project, &feature, &holder, &ttl.as_secs_f64()],
            )
            .await
            .map_err(db(format!("taking the lease of {feature}")))?;
        Ok(row.map(|r| Lease {
            feature: feature.to_string(),
            holder: holder.to_string(),
            token: r.get(0),
        }))
    }

    /// Takes the lease of the first of `features` (in their order: the backlog's) that no one
    /// holds or whose holder's time ran out, for `holder` for `ttl`; None when every one is
    /// held. Processes on any machines calling at once each get another feature: a row another
    /// taker has locked is skipped (`FOR UPDATE SKIP LOCKED`), never waited for.
    pub async fn take_next(
        &mut self,
        features: &[String],
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError> {
        let (project, tx) = self.begin("starting to take a feature").await?;
        tx.execute(
            "INSERT INTO consort_store.leases (project, feature) \
             SELECT $1, f FROM unnest($2::text[]) AS f ON CONFLICT DO NOTHING",
            &[&project, &features],
        )
        .await
        .map_err(db("listing the features to take"))?;
        // A lost holder's feature is taken over after a pause that doubles with each worker
        // lost in a row, and not at all once the bound is reached (it waits for a person).
        let free = tx
            .query_opt(
                "SELECT feature FROM consort_store.leases \
                 WHERE project = $1 AND feature = ANY($2) \
                 AND (holder IS NULL OR (lost + 1 < $4 AND expires_at \
                      + make_interval(secs => $3 * (power(2, least(lost, 10)) - 1)) \
                      <= clock_timestamp())) \
                 ORDER BY array_position($2, feature) LIMIT 1 FOR UPDATE SKIP LOCKED",
                &[&project, &features, &ttl.as_secs_f64(), &LOST_WORKERS_BOUND],
            )
            .await
            .map_err(db("finding a feature no one holds"))?;
        let Some(free) = free else {
            // Ended here, not when the transaction is dropped: a dropped one's rollback waits
            // for the connection's next use, its inserted rows locked and the session idle in
            // a transaction meanwhile.
            tx.commit()
                .await
                .map_err(db("ending the look for a feature to take"))?;
            return Ok(None);
        };
        let feature: String = free.get(0);
        let token: i64 = tx
            .query_one(
                "UPDATE consort_store.leases \
                 SET holder = $3, token = token + 1, since = clock_timestamp(), \
                     expires_at = clock_timestamp() + make_interval(secs => $4), \
                     lost = lost + (holder IS NOT NULL)::int \
                 WHERE project = $1 AND feature = $2 RETURNING token",
                &[&project, &feature, &holder, &ttl.as_secs_f64()],
            )
            .await
            .map_err(db(format!("taking the lease of {feature}")))?
            .get(0);
        tx.commit()
            .await
            .map_err(db(format!("committing the lease of {feature}")))?;
        Ok(Some(Lease {
            feature,
            holder: holder.to_string(),
            token,
        }))
    }

    /// Extends `lease` by `ttl` from now; false when it is no longer held (it ran out, or
    /// another took it over).
    pub async fn renew(&self, lease: &Lease, ttl: Duration) -> Result<bool, StoreError> {
        let n = self
            .client
            .execute(
                "UPDATE consort_store.leases \
                 SET expires_at = clock_timestamp() + make_interval(secs => $4) \
                 WHERE project = $1 AND feature = $2 AND token = $3 \
                 AND expires_at > clock_timestamp()",
                &[
                    &self.project,
                    &lease.feature,
                    &lease.token,
                    &ttl.as_secs_f64(),
                ],
            )
            .await
            .map_err(db(format!("renewing the lease of {}", lease.feature)))?;
        Ok(n == 1)
    }

    /// Gives `lease` up (nothing happens when it is no longer held); its token stays counted.
    pub async fn release(&self, lease: &Lease) -> Result<(), StoreError> {
        self.client
            .execute(
                "UPDATE consort_store.leases \
                 SET holder = NULL, since = NULL, expires_at = NULL, lost = 0 \
                 WHERE project = $1 AND feature = $2 AND token = $3",
                &[&self.project, &lease.feature, &lease.token],
            )
            .await
            .map_err(db(format!("releasing the lease of {}", lease.feature)))?;
        Ok(())
    }
}

/// Locks `feature`'s lease row for the transaction (making it when missing), which serialises
/// its appends, and checks `fence` under that lock; returns the ledger's last entry (sequence
/// number and hash), read under the lock.
async fn lock_lease_row(
    tx: &Transaction<'_>,
    project: &str,
    feature: &str,
    fence: Fence<'_>,
) -> Result<Option<(i64, String)>, StoreError> {
    // The lease row locked first; the chain's end read after, in a statement of its own. Under
    // READ COMMITTED a statement's snapshot is taken when it starts: read in the locking
    // statement, the end would be what it was before the wait for the lock, and two appenders
    // would compute the same sequence number.
    const LOCK: &str = "SELECT token, expires_at > clock_timestamp(), holder \
         FROM consort_store.leases WHERE project = $1 AND feature = $2 FOR UPDATE";
    const HEAD: &str = "SELECT seq, hash FROM consort_store.events \
         WHERE project = $1 AND feature = $2 ORDER BY seq DESC LIMIT 1";
    let locking = db(format!("locking the ledger of {feature}"));
    let mut row = tx.query_opt(LOCK, &[&project, &feature]).await;
    if matches!(row, Ok(None)) {
        tx.execute(
            "INSERT INTO consort_store.leases (project, feature) VALUES ($1, $2) \
             ON CONFLICT DO NOTHING",
            &[&project, &feature],
        )
        .await
        .map_err(db(format!("locking the ledger of {feature}")))?;
        row = tx.query_opt(LOCK, &[&project, &feature]).await;
    }
    let row = row.map_err(locking)?.ok_or_else(|| StoreError::BadRow {
        feature: feature.to_string(),
        seq: 0,
        reason: "its lease row vanished while it was being locked".into(),
    })?;
    let last = tx
        .query_opt(HEAD, &[&project, &feature])
        .await
        .map_err(db(format!("reading the end of the ledger of {feature}")))?
        .map(|r| (r.get::<_, i64>(0), r.get::<_, String>(1)));
    let lease = match fence {
        Fence::Lease(lease) => lease,
        Fence::Person | Fence::PersonJudgedOn { .. } => {
            if let Fence::PersonJudgedOn { seen } = fence {
                judged_on_the_end(feature, seen, last.as_ref())?;
            }
            end_lease_for_a_person(tx, (project, feature), row.get(2)).await?;
            return Ok(last);
        }
    };
    let token: i64 = row.get(0);
    let live: Option<bool> = row.get(1);
    let holder: Option<String> = row.get(2);
    let why = if token != lease.token && holder.is_none() {
        Some(format!(
            "was ended by a person's decision recorded by another process (the feature's token is now {token})"
        ))
    } else if token != lease.token {
        Some(format!(
            "was taken over (the feature's token is now {token})"
        ))
    } else if live != Some(true) {
        Some("ran out or was given up".to_string())
    } else {
        None
    };
    match why {
        None => Ok(last),
        Some(why) => Err(StoreError::StaleLease {
            feature: feature.to_string(),
            token: lease.token,
            why,
        }),
    }
}

/// A row's sequence number as an entry's: refused when negative.
fn seq_number(feature: &str, seq: i64) -> Result<u64, StoreError> {
    u64::try_from(seq).map_err(|_| StoreError::BadRow {
        feature: feature.to_string(),
        seq,
        reason: "a negative sequence number".into(),
    })
}

/// Refuses a person's decision judged on `seen` entries when the ledger's `last` entry says it
/// holds another number by now.
fn judged_on_the_end(
    feature: &str,
    seen: u64,
    last: Option<&(i64, String)>,
) -> Result<(), StoreError> {
    let now = match last {
        None => 0,
        Some((seq, _)) => seq_number(feature, *seq)?,
    };
    if seen == now {
        return Ok(());
    }
    Err(StoreError::MovedOn {
        feature: feature.to_string(),
        seen,
        now,
    })
}

/// A person's decision ends the lease of whoever drives the feature (`holder`, as the locked
/// row names it), in the decision's transaction: that process's next append, renewal, push or
/// promotion is refused, and the next to take the feature replays the decision. A person has
/// looked at the feature, too: the fleet may take it again from the first try, and a lost
/// holder's run-out lease is no loss to count again.
async fn end_lease_for_a_person(
    tx: &Transaction<'_>,
    (project, feature): (&str, &str),
    holder: Option<String>,
) -> Result<(), StoreError> {
    const END_LEASE: &str = "UPDATE consort_store.leases \
         SET holder = NULL, token = token + 1, expires_at = clock_timestamp() \
         WHERE project = $1 AND feature = $2 AND holder IS NOT NULL \
             AND expires_at > clock_timestamp()";
    const FORGIVE: &str = "UPDATE consort_store.leases \
         SET lost = 0, holder = NULL, token = token + (holder IS NOT NULL)::int \
         WHERE project = $1 AND feature = $2 \
             AND (lost > 0 OR (holder IS NOT NULL AND expires_at <= clock_timestamp()))";
    let ended = tx
        .execute(END_LEASE, &[&project, &feature])
        .await
        .map_err(db(format!(
            "ending the lease of {feature} for a person's decision"
        )))?;
    tx.execute(FORGIVE, &[&project, &feature])
        .await
        .map_err(db(format!("counting {feature}'s lost workers from zero")))?;
    if ended > 0 {
        tracing::info!(
            feature,
            holder = holder.as_deref().unwrap_or("?"),
            "a person's decision ends the lease of the process that drives the feature"
        );
    }
    Ok(())
}

/// One row of a ledger checked as the `nth` entry after `prev`.
fn checked_row(
    feature: &str,
    seq: i64,
    hash: String,
    line: String,
    nth: u64,
    prev: &ContentHash,
) -> Result<Entry<Event>, StoreError> {
    let bad = |reason: String| StoreError::BadRow {
        feature: feature.to_string(),
        seq,
        reason,
    };
    let entry = consort_actors::verify_line::<Event>(&line, nth, prev)
        .map_err(|e| bad(consort_actors::error_chain(&e)))?;
    if entry.hash.to_hex() != hash {
        return Err(bad("its stored hash is not its line's".into()));
    }
    if u64::try_from(seq).ok() != Some(entry.seq) {
        return Err(bad(format!("its line says entry {}", entry.seq)));
    }
    Ok(entry)
}

/// Creates the schema or brings it to this version, under an advisory lock held for the
/// transaction; refuses a schema from a newer Consort.
async fn migrate(client: &mut Client) -> Result<(), StoreError> {
    let known = MIGRATIONS.len() as i32;
    let tx = client
        .transaction()
        .await
        .map_err(db("starting the schema check"))?;
    tx.batch_execute(
        "SELECT pg_advisory_xact_lock(hashtext('consort_store')); \
         CREATE SCHEMA IF NOT EXISTS consort_store; \
         CREATE TABLE IF NOT EXISTS consort_store.version (\
             one boolean PRIMARY KEY DEFAULT true CHECK (one), version integer NOT NULL);",
    )
    .await
    .map_err(db("creating the store's schema"))?;
    let found: i32 = tx
        .query_opt("SELECT version FROM consort_store.version", &[])
        .await
        .map_err(db("reading the store's version"))?
        .map_or(0, |r| r.get(0));
    if found > known {
        return Err(StoreError::NewerSchema { found, known });
    }
    for (i, sql) in MIGRATIONS.iter().enumerate().skip(found as usize) {
        tx.batch_execute(sql).await.map_err(db(format!(
            "bringing the store's schema to version {}",
            i + 1
        )))?;
    }
    tx.execute(
        "INSERT INTO consort_store.version (version) VALUES ($1) \
         ON CONFLICT (one) DO UPDATE SET version = EXCLUDED.version",
        &[&known],
    )
    .await
    .map_err(db("recording the store's version"))?;
    tx.commit()
        .await
        .map_err(db("committing the store's schema"))?;
    Ok(())
}
