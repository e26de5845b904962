//! Applying a schema plan's ordered migrations and recording them in `consort_migrations`.
//!
//! Each migration runs in its own transaction together with its record
//! `(version, checksum, applied_at)`, where the checksum is [`Migration::checksum`]. A version
//! already recorded with the same checksum is skipped; with another checksum it is a typed
//! [`Error::ChecksumMismatch`] and nothing more is applied. Concurrent appliers are serialised
//! by a transaction-scoped advisory lock.

use std::collections::{BTreeMap, HashSet};

use consort_actors::Migration;
use tokio_postgres::Client;
use tracing::debug;

use crate::error::{Error, Result};

mod psql_script;
mod tool;

pub use psql_script::PsqlTarget;
pub use tool::{MigrationTool, ToolApplied};

/// The table that records applied migrations.
pub const MIGRATIONS_TABLE: &str = "consort_migrations";

/// The advisory-lock key that serialises migration appliers on one database.
const LOCK_KEY: i64 = 0x0063_6f6e_736f_7274; // "consort"

/// What an apply did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MigrationReport {
    /// Versions applied now, in order.
    pub applied: Vec<String>,
    /// Versions that were already recorded with the same checksum.
    pub already_applied: Vec<String>,
}

/// Checks a plan: versions non-empty and unique.
pub fn check_plan(migrations: &[Migration]) -> Result<()> {
    let mut seen = HashSet::new();
    for m in migrations {
        if m.version.trim().is_empty() {
            return Err(Error::InvalidPlan(
                "a migration has an empty version".into(),
            ));
        }
        if !seen.insert(m.version.as_str()) {
            return Err(Error::InvalidPlan(format!(
                "migration version {} appears twice in the plan",
                m.version
            )));
        }
    }
    Ok(())
}

/// Creates the record table when missing.
pub async fn ensure_table(client: &Client) -> Result<()> {
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS consort_migrations (\
                version text PRIMARY KEY, \
                checksum text NOT NULL, \
                applied_at timestamptz NOT NULL DEFAULT clock_timestamp())",
        )
        .await
        .map_err(|e| Error::from_pg("creating consort_migrations", e))
}

/// Applies `migrations` in order, each in its own transaction with its record. A psql script
/// among them ([`Migration::is_psql_script`]) is refused: see [`apply_with_psql`].
pub async fn apply(client: &mut Client, migrations: &[Migration]) -> Result<MigrationReport> {
    apply_with_psql(client, migrations, None).await
}

/// [`apply`], with a project's existing psql scripts applied by psql at `psql` (the same
/// database as `client`), each recorded like any migration once psql committed it.
pub async fn apply_with_psql(
    client: &mut Client,
    migrations: &[Migration],
    psql: Option<&PsqlTarget>,
) -> Result<MigrationReport> {
    let (report, outcome) = apply_partial(client, migrations, psql).await;
    outcome.map(|()| report)
}

/// Like [`apply_with_psql`], but also returns what was applied before a failure.
pub async fn apply_partial(
    client: &mut Client,
    migrations: &[Migration],
    psql: Option<&PsqlTarget>,
) -> (MigrationReport, Result<()>) {
    let mut report = MigrationReport::default();
    let outcome = apply_into(client, migrations, psql, &mut report).await;
    (report, outcome)
}

async fn apply_into(
    client: &mut Client,
    migrations: &[Migration],
    psql: Option<&PsqlTarget>,
    report: &mut MigrationReport,
) -> Result<()> {
    check_plan(migrations)?;
    if migrations.is_empty() {
        return Ok(());
    }
    ensure_table(client).await?;
    for m in migrations {
        let planned = m.checksum().to_hex();
        let tx = client
            .transaction()
            .await
            .map_err(|e| Error::from_pg("beginning a migration transaction", e))?;
        tx.execute("SELECT pg_advisory_xact_lock($1)", &[&LOCK_KEY])
            .await
            .map_err(|e| Error::from_pg("locking consort_migrations", e))?;
        let row = tx
            .query_opt(
                "SELECT checksum FROM consort_migrations WHERE version = $1",
                &[&m.version],
            )
            .await
            .map_err(|e| Error::from_pg("reading consort_migrations", e))?;
        if let Some(row) = row {
            let recorded: String = row.get(0);
            if recorded != planned {
                return Err(Error::ChecksumMismatch {
                    version: m.version.clone(),
                    recorded,
                    planned,
                });
            }
            report.already_applied.push(m.version.clone());
            continue;
        }
        if m.is_psql_script() {
            let Some(target) = psql else {
                return Err(Error::Migration {
                    version: m.version.clone(),
                    detail: "it is a psql script (a line starts with a backslash meta-command), and this backend applies migrations through the protocol only; write it as plain SQL".into(),
                });
            };
            psql_script::apply(target, m).await?;
        } else if let Err(e) = tx.batch_execute(&m.sql).await {
            return Err(Error::Migration {
                version: m.version.clone(),
                detail: e
                    .as_db_error()
                    .map(|d| format!("{} (SQLSTATE {})", d.message(), d.code().code()))
                    .unwrap_or_else(|| consort_actors::error_chain(&e)),
            });
        }
        tx.execute(
            "INSERT INTO consort_migrations (version, checksum) VALUES ($1, $2)",
            &[&m.version, &planned],
        )
        .await
        .map_err(|e| Error::from_pg(format!("recording migration {}", m.version), e))?;
        tx.commit().await.map_err(|e| Error::Migration {
            version: m.version.clone(),
            detail: format!("commit failed: {}", consort_actors::error_chain(&e)),
        })?;
        debug!(version = %m.version, "migration applied");
        report.applied.push(m.version.clone());
    }
    Ok(())
}

/// The recorded migrations: version → checksum (empty when the table does not exist).
pub async fn recorded(client: &Client) -> Result<BTreeMap<String, String>> {
    let exists: bool = client
        .query_one("SELECT to_regclass('consort_migrations') IS NOT NULL", &[])
        .await
        .map_err(|e| Error::from_pg("looking for consort_migrations", e))?
        .get(0);
    if !exists {
        return Ok(BTreeMap::new());
    }
    let rows = client
        .query(
            "SELECT version, checksum FROM consort_migrations ORDER BY applied_at, version",
            &[],
        )
        .await
        .map_err(|e| Error::from_pg("reading consort_migrations", e))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// Whether every planned version is recorded with the plan's checksum.
pub async fn verify(client: &Client, migrations: &[Migration]) -> Result<bool> {
    let rec = recorded(client).await?;
    Ok(migrations
        .iter()
        .all(|m| rec.get(&m.version) == Some(&m.checksum().to_hex())))
}
