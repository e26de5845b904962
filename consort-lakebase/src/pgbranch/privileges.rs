//! What the administrator may do, and the roles and privileges set up once per server: the
//! owner role and (when the provider manages it) the parent database.

use tokio_postgres::{Client, Config};
use tracing::{info, warn};

use super::catalog::{CLOSED, db_exists, is_dup, open_private};
use super::{ServerOptions, ServerTarget};
use crate::error::{Error, Result};
use crate::names::quote_ident;
use crate::pgconn::{connect_config, describe};

/// Whether the administrator is a superuser; an error when it may not branch at all.
pub(super) async fn check_admin(client: &Client, admin: &Config) -> Result<bool> {
    let sql =
        "SELECT rolsuper, rolcreatedb, rolcreaterole FROM pg_roles WHERE rolname = current_user";
    let row = client
        .query_one(sql, &[])
        .await
        .map_err(|e| Error::from_pg("reading the administrator's privileges", e))?;
    let (is_super, createdb, createrole): (bool, bool, bool) = (row.get(0), row.get(1), row.get(2));
    if !(is_super || (createdb && createrole)) {
        return Err(Error::PermissionDenied(format!(
            "{} needs SUPERUSER or CREATEDB and CREATEROLE to branch databases",
            describe(admin)
        )));
    }
    Ok(is_super)
}

/// Makes the owner role and prepares the parent. Every step is idempotent (it looks before it
/// makes or changes anything), so a set-up interrupted anywhere — its process killed, its
/// server stopped — is finished by the next one, and a repeated set-up asks the server for
/// nothing it would refuse.
pub(super) async fn set_up(
    client: &Client,
    target: &ServerTarget,
    opts: &ServerOptions,
    is_super: bool,
) -> Result<()> {
    ensure_owner_role(client, &opts.owner_role).await?;
    let owner = quote_ident(&opts.owner_role);
    if !is_super {
        // Already a member when the role existed before: the error is the expected answer.
        let _ = client
            .batch_execute(&format!("GRANT {owner} TO CURRENT_USER"))
            .await;
    }
    let exists = db_exists(client, &target.parent).await?;
    if target.manage_parent {
        manage_parent(client, target, opts, exists).await
    } else if !exists {
        Err(Error::NotFound(format!(
            "the parent database {} does not exist",
            target.parent
        )))
    } else {
        warn_if_public_connect(client, &target.parent).await
    }
}

/// Creates the `NOLOGIN` owner role unless it exists. `CREATE ROLE` has no `IF NOT EXISTS`:
/// `pg_roles` is read first, and a role another session created in between (outside the
/// set-up lock, which only Consort's providers take) is the duplicate error, accepted.
async fn ensure_owner_role(client: &Client, role: &str) -> Result<()> {
    let exists = client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .await
        .map_err(|e| Error::from_pg("looking for the owner role", e))?
        .is_some();
    if exists {
        return Ok(());
    }
    match client
        .batch_execute(&format!("CREATE ROLE {} NOLOGIN", quote_ident(role)))
        .await
    {
        Ok(()) => {
            info!(role = %role, "created the owner role");
            Ok(())
        }
        Err(e) if is_dup(&e) => Ok(()),
        Err(e) => Err(Error::from_pg("creating the owner role", e)),
    }
}

/// Creates the parent when missing, closes `CONNECT` for `PUBLIC` on it and the maintenance
/// databases, gives its `public` schema to the owner role and lets that role create schemas
/// in it.
async fn manage_parent(
    client: &Client,
    target: &ServerTarget,
    opts: &ServerOptions,
    exists: bool,
) -> Result<()> {
    let parent = target.parent.as_str();
    if !exists {
        match client
            .batch_execute(&format!("CREATE DATABASE {}{CLOSED}", quote_ident(parent)))
            .await
        {
            Ok(()) => info!(parent = %parent, "created the parent database"),
            Err(e) if is_dup(&e) => {}
            Err(e) => return Err(Error::from_pg("creating the parent database", e)),
        }
    }
    // Created closed here, or by a process that died before it opened it.
    if !allows_connections(client, parent).await? {
        open_private(client, parent, None).await?;
    }
    for db in [parent, "postgres", "template1"] {
        if public_may_connect(client, db).await? {
            client
                .batch_execute(&format!(
                    "REVOKE CONNECT, TEMPORARY ON DATABASE {} FROM PUBLIC",
                    quote_ident(db)
                ))
                .await
                .map_err(|e| Error::from_pg("restricting CONNECT", e))?;
        }
    }
    let mut pcfg = target.admin.clone();
    pcfg.dbname(parent);
    let pc = connect_config(&pcfg, target.admin_ssl, None).await?;
    let owner_sql =
        "SELECT pg_get_userbyid(nspowner) = $1 FROM pg_namespace WHERE nspname = 'public'";
    let what = "reading the parent's schema owner";
    let owned = ask_about(&pc, owner_sql, &opts.owner_role, what).await?;
    let owner = quote_ident(&opts.owner_role);
    if !owned {
        pc.batch_execute(&format!("ALTER SCHEMA public OWNER TO {owner}"))
            .await
            .map_err(|e| Error::from_pg("giving the parent's schema to the owner role", e))?;
    }
    // Migrations may create schemas of their own: promoted, they create them in the parent.
    let create_sql = "SELECT has_database_privilege($1, current_database(), 'CREATE')";
    let what = "reading the owner role's privileges on the parent";
    if !ask_about(&pc, create_sql, &opts.owner_role, what).await? {
        pc.batch_execute(&format!(
            "GRANT CREATE ON DATABASE {} TO {owner}",
            quote_ident(parent)
        ))
        .await
        .map_err(|e| Error::from_pg("letting the owner role create schemas in the parent", e))?;
    }
    Ok(())
}

/// Whether `PUBLIC` may connect to database `db`.
async fn public_may_connect(client: &Client, db: &str) -> Result<bool> {
    let sql = "SELECT has_database_privilege('public', $1, 'CONNECT')";
    ask_about(client, sql, db, "reading database privileges").await
}

/// Whether `db` takes sessions at all (`datallowconn`).
async fn allows_connections(client: &Client, db: &str) -> Result<bool> {
    let sql = "SELECT datallowconn FROM pg_database WHERE datname = $1";
    ask_about(client, sql, db, "reading whether a database takes sessions").await
}

/// The yes or no that `sql` answers about the database or role `name` (its `$1`).
async fn ask_about(client: &Client, sql: &str, name: &str, what: &str) -> Result<bool> {
    let row = client
        .query_one(sql, &[&name])
        .await
        .map_err(|e| Error::from_pg(what, e))?;
    row.try_get(0).map_err(|e| Error::from_pg(what, e))
}

/// A parent Consort did not create is never changed; an open one is worth a warning.
async fn warn_if_public_connect(client: &Client, parent: &str) -> Result<()> {
    if public_may_connect(client, parent).await? {
        warn!(
            parent = %parent,
            "PUBLIC may CONNECT to the parent database; branch roles could connect to it (Consort does not change a database it did not create)"
        );
    }
    Ok(())
}

/// One thing migrations need of the parent, and whether it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParentPrivilege {
    /// Whether it holds.
    pub ok: bool,
    /// What was checked.
    pub what: String,
    /// The statement that grants it, for a person with the rights to run it.
    pub grant: String,
}

/// What migrations need of a parent: the owner role (which applies them, in every base and at
/// promotion) may create schemas in the parent database and objects in its `public` schema.
pub(super) async fn parent_privileges(
    client: &Client,
    parent: &str,
    owner: &str,
) -> Result<Vec<ParentPrivilege>> {
    let row = client
        .query_one(
            "SELECT has_database_privilege($1, current_database(), 'CREATE'), \
                    has_schema_privilege($1, 'public', 'CREATE')",
            &[&owner],
        )
        .await
        .map_err(|e| Error::from_pg("reading the owner role's privileges on the parent", e))?;
    let (db, public): (bool, bool) = (row.get(0), row.get(1));
    let (p, o) = (quote_ident(parent), quote_ident(owner));
    Ok(vec![
        ParentPrivilege {
            ok: db,
            what: format!(
                "{owner} may create schemas in {parent} (migrations that CREATE SCHEMA, at promotion)"
            ),
            grant: format!("GRANT CREATE ON DATABASE {p} TO {o};"),
        },
        ParentPrivilege {
            ok: public,
            what: format!("{owner} may create objects in {parent}'s public schema"),
            grant: format!("GRANT USAGE, CREATE ON SCHEMA public TO {o};"),
        },
    ])
}
