//! Catalog look-ups and the few statements every part of template branching shares.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;

use super::meta::Meta;
use crate::error::{Error, Result};
use crate::names::{quote_ident, quote_literal};

/// Whether `e` says the object exists already (role, row or database).
pub(super) fn is_dup(e: &tokio_postgres::Error) -> bool {
    e.code().is_some_and(|c| {
        *c == SqlState::DUPLICATE_OBJECT
            || *c == SqlState::UNIQUE_VIOLATION
            || *c == SqlState::DUPLICATE_DATABASE
    })
}

/// Whether database `db` exists.
pub(super) async fn db_exists(admin: &Client, db: &str) -> Result<bool> {
    returns_row(
        admin,
        "SELECT 1 FROM pg_database WHERE datname = $1",
        db,
        "looking up a database",
    )
    .await
}

/// Whether `db` exists and is a template.
pub(super) async fn is_template(admin: &Client, db: &str) -> Result<bool> {
    returns_row(
        admin,
        "SELECT 1 FROM pg_database WHERE datname = $1 AND datistemplate",
        db,
        "looking up a base",
    )
    .await
}

/// Whether `sql`, about the object named `$1`, returns a row.
async fn returns_row(admin: &Client, sql: &str, name: &str, what: &str) -> Result<bool> {
    Ok(admin
        .query_opt(sql, &[&name])
        .await
        .map_err(|e| Error::from_pg(what, e))?
        .is_some())
}

/// The databases whose names start with `prefix`, each with its own comment (an unparsed
/// marker, when it has one); `what` names the look-up in an error.
pub(super) async fn dbs_named(
    admin: &Client,
    prefix: &str,
    what: &str,
) -> Result<Vec<(String, Option<String>)>> {
    let sql = "SELECT datname::text, shobj_description(oid, 'pg_database') FROM pg_database \
               WHERE starts_with(datname::text, $1)";
    let rows = admin
        .query(sql, &[&prefix])
        .await
        .map_err(|e| Error::from_pg(what, e))?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The marker of database `d`: its own comment, or, for a branch killed between its `CREATE
/// DATABASE` and its comment (two statements, never one transaction), the marker of its
/// owner — the role of the same name that Consort made and commented in one transaction.
pub(super) const DB_MARKER: &str = "COALESCE(shobj_description(d.oid, 'pg_database'), \
     (SELECT shobj_description(r.oid, 'pg_authid') FROM pg_roles r \
      WHERE r.oid = d.datdba AND r.rolname = d.datname))";

/// The marker of `db`; `None` when it does not exist or is not one of ours.
pub(super) async fn db_meta(admin: &Client, db: &str) -> Result<Option<Meta>> {
    Ok(db_lookup(admin, db).await?.flatten())
}

/// In one round trip: `None` when `db` does not exist, else its marker (`None` when it is not
/// one of ours).
pub(super) async fn db_lookup(admin: &Client, db: &str) -> Result<Option<Option<Meta>>> {
    marker_lookup(
        admin,
        &format!("SELECT {DB_MARKER} FROM pg_database d WHERE d.datname = $1"),
        db,
        "reading a database marker",
    )
    .await
}

/// The marker of role `role`; `None` when it does not exist or is not one of ours.
pub(super) async fn role_meta(admin: &Client, role: &str) -> Result<Option<Meta>> {
    marker_lookup(
        admin,
        "SELECT shobj_description(oid, 'pg_authid') FROM pg_roles WHERE rolname = $1",
        role,
        "reading a role marker",
    )
    .await
    .map(Option::flatten)
}

/// Runs `sql`, which selects the comment of the shared object named `$1`: `None` when there
/// is no such object, else its marker (`None` when it is not one of ours).
async fn marker_lookup(
    admin: &Client,
    sql: &str,
    name: &str,
    what: &str,
) -> Result<Option<Option<Meta>>> {
    let row = admin
        .query_opt(sql, &[&name])
        .await
        .map_err(|e| Error::from_pg(what, e))?;
    Ok(row.map(|r| Meta::parse(r.get::<_, Option<&str>>(0))))
}

/// Writes the marker `text` on database `db`.
pub(super) async fn comment_db(admin: &Client, db: &str, text: &str) -> Result<()> {
    admin
        .batch_execute(&format!(
            "COMMENT ON DATABASE {} IS {}",
            quote_ident(db),
            quote_literal(text)
        ))
        .await
        .map_err(|e| Error::from_pg("marking a database", e))
}

/// The clause that makes a new database refuse every session until [`open_private`] opens it.
pub(super) const CLOSED: &str = " ALLOW_CONNECTIONS false";

/// Opens `db`, created with [`CLOSED`], to its owner and the superusers only. `PUBLIC` loses
/// `CONNECT` and `TEMPORARY` before the first session may start: every branch role is a member
/// of the owner role, whose grants reach into every copy, so a database open to `PUBLIC` for a
/// moment is one a test on another branch can find in `pg_database` and write to.
pub(super) async fn open_private(admin: &Client, db: &str, marker: Option<&str>) -> Result<()> {
    let q = quote_ident(db);
    let comment = marker
        .map(|m| format!("COMMENT ON DATABASE {q} IS {}; ", quote_literal(m)))
        .unwrap_or_default();
    admin
        .batch_execute(&format!(
            "REVOKE CONNECT, TEMPORARY ON DATABASE {q} FROM PUBLIC; {comment}\
             ALTER DATABASE {q} ALLOW_CONNECTIONS true"
        ))
        .await
        .map_err(|e| Error::from_pg("opening a new database to its owner only", e))
}

/// Ends every session on `db` and waits (briefly) until their backends are gone.
///
/// `DROP DATABASE … WITH (FORCE)` signals the sessions it finds and then re-checks every
/// **100 ms** until they have exited (PostgreSQL's `CountOtherDBBackends`). A session that
/// has just disconnected — the login probe of `create`, a test runner's `psql` that has just
/// exited — is usually still exiting when the branch is dropped, so every drop paid that
/// 100 ms sleep. Terminating first and polling at 1 ms gets the same result in a few
/// milliseconds; `FORCE` stays as the backstop.
async fn end_sessions(admin: &Client, db: &str) -> Result<()> {
    let signalled: i64 = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = $1 AND pid <> pg_backend_pid()",
            &[&db],
        )
        .await
        .map_err(|e| Error::from_pg(format!("ending the sessions on {db}"), e))?
        .get(0);
    if signalled == 0 {
        return Ok(());
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
        let left: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1",
                &[&db],
            )
            .await
            .map_err(|e| Error::from_pg(format!("ending the sessions on {db}"), e))?
            .get(0);
        if left == 0 {
            break;
        }
    }
    Ok(())
}

/// Ends the sessions on `db` and drops it.
pub(super) async fn drop_db(admin: &Client, db: &str) -> Result<()> {
    end_sessions(admin, db).await?;
    admin
        .batch_execute(&format!(
            "DROP DATABASE IF EXISTS {} WITH (FORCE)",
            quote_ident(db)
        ))
        .await
        .map_err(|e| Error::from_pg(format!("dropping database {db}"), e))
}
