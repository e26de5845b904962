//! The branch lifecycle: create (a login role and a copy of a base), reset (a fresh copy under
//! the same name), delete.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tracing::warn;

use super::catalog::{CLOSED, db_lookup, db_meta, drop_db, is_dup, open_private, role_meta};
use super::meta::Meta;
use super::{ServerProvider, TEMPLATE_PREFIX};
use crate::embedded::branch_space;
use crate::error::{Error, Result};
use crate::names::{db_ident, quote_ident, quote_literal, random_password, validate_branch_name};
use crate::provider::{BaseRef, Branch, Secret};
use crate::scram;

impl ServerProvider {
    /// Creates branch `name` from base `from`; returns once its role can log in.
    pub(super) async fn create_impl(&self, name: &str, from: &BaseRef) -> Result<Branch> {
        validate_branch_name(name)?;
        if !from.id.starts_with(TEMPLATE_PREFIX) {
            return Err(Error::InvalidName(format!(
                "{} is not a base of this provider",
                from.id
            )));
        }
        let ident = db_ident(name);
        let password = random_password();
        let meta = Meta::now(Some(from), self.admin.live())?;
        let marker = meta.text()?;
        {
            let mut slot = self.admin.slot().await;
            let admin = self.admin.client(&mut slot).await?;
            self.create_role(admin, name, &ident, &password, &marker)
                .await?;
            if let Err(e) = self
                .copy_base(admin, &ident, &from.id, &marker, "creating a branch")
                .await
            {
                let _ = admin
                    .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&ident)))
                    .await;
                let code = e.sqlstate();
                return Err(if code == Some(&SqlState::DUPLICATE_DATABASE) {
                    Error::AlreadyExists(format!("branch {name}"))
                } else if code == Some(&SqlState::INVALID_CATALOG_NAME) {
                    Error::NotFound(format!("base {}", from.id))
                } else {
                    e
                });
            }
        }
        self.secrets.insert(name, Secret::new(password));
        let branch = Branch {
            name: name.to_string(),
            id: ident,
            base: from.clone(),
            created_at: meta.created_at(),
        };
        self.wait_login(&branch).await?;
        Ok(branch)
    }

    /// The branch's login role: a member of the owner role, with a SCRAM verifier of
    /// `password` and the marker `marker`.
    async fn create_role(
        &self,
        admin: &Client,
        name: &str,
        ident: &str,
        password: &str,
        marker: &str,
    ) -> Result<()> {
        let q = quote_ident(ident);
        let verifier = scram::verifier(password.as_bytes(), scram::BRANCH_ITERATIONS);
        // A non-superuser administrator must be a member of the role to give it a database.
        let membership = if self.is_super {
            String::new()
        } else {
            format!(" GRANT {q} TO CURRENT_USER;")
        };
        let create_role = format!(
            "BEGIN; CREATE ROLE {q} LOGIN PASSWORD {} IN ROLE {}; COMMENT ON ROLE {q} IS {};{membership} COMMIT",
            quote_literal(&verifier),
            quote_ident(&self.opts.owner_role),
            quote_literal(marker)
        );
        match admin.batch_execute(&create_role).await {
            Ok(()) => Ok(()),
            Err(e) => {
                let _ = admin.batch_execute("ROLLBACK").await;
                Err(if is_dup(&e) {
                    Error::AlreadyExists(format!("branch {name}"))
                } else {
                    Error::from_pg(format!("creating the role of {name}"), e)
                })
            }
        }
    }

    /// The one copy of a base into a branch database, shared by create and reset: owned by
    /// the branch role, no `CONNECT` for `PUBLIC`, marked with `marker`.
    async fn copy_base(
        &self,
        admin: &Client,
        ident: &str,
        base_id: &str,
        marker: &str,
        what: &str,
    ) -> Result<()> {
        let q = quote_ident(ident);
        let copy = |space: &str| {
            format!(
                "CREATE DATABASE {q} OWNER {q} TEMPLATE {}{space} STRATEGY FILE_COPY{CLOSED}",
                quote_ident(base_id)
            )
        };
        let space = self.in_memory(admin, base_id).await;
        let copied = self
            .admin
            .exec_busy(admin, &copy(space.as_deref().unwrap_or("")), what)
            .await;
        match copied {
            // The memory filled up meanwhile: this branch goes to disk.
            Err(e) if space.is_some() && e.sqlstate().is_some_and(|c| short_of_room(c.code())) => {
                warn!(error = %consort_actors::error_chain(&e), "a branch goes to disk: no room in memory");
                self.admin.exec_busy(admin, &copy(""), what).await?;
            }
            done => done?,
        }
        open_private(admin, ident, Some(marker)).await
    }

    /// ` TABLESPACE …` when a branch of `base_id` goes to memory: this provider makes branches
    /// there and it has room for one (see `embedded::branch_space`).
    async fn in_memory(&self, admin: &Client, base_id: &str) -> Option<String> {
        let place = self.branch_space.as_deref()?;
        let known = self
            .base_sizes
            .lock()
            .ok()
            .and_then(|sizes| sizes.get(base_id).copied());
        let bytes = match known {
            Some(b) => b,
            None => {
                let row = admin
                    .query_one("SELECT pg_database_size($1::name)", &[&base_id])
                    .await
                    .ok()?;
                let b = u64::try_from(row.get::<_, i64>(0)).ok()?;
                if let Ok(mut sizes) = self.base_sizes.lock() {
                    sizes.insert(base_id.to_string(), b);
                }
                b
            }
        };
        branch_space::has_room(place, bytes)
            .then(|| format!(" TABLESPACE {}", branch_space::TABLESPACE))
    }

    /// Returns when the branch role can log in over the branch endpoint.
    async fn wait_login(&self, branch: &Branch) -> Result<()> {
        let info = self.connect_info_impl(branch).await?;
        let deadline = Instant::now() + self.opts.login_timeout;
        loop {
            match crate::pgconn::connect(&info).await {
                Ok(_c) => return Ok(()),
                Err(e) if Instant::now() >= deadline => {
                    return Err(Error::Timeout(format!(
                        "branch {} did not accept logins: {}",
                        branch.name,
                        consort_actors::error_chain(&e)
                    )));
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
            }
        }
    }

    /// Drops the branch's database and copies its base again under the same name.
    pub(super) async fn reset_impl(&self, branch: &Branch) -> Result<Branch> {
        validate_branch_name(&branch.name)?;
        let ident = db_ident(&branch.name);
        let meta = Meta::now(Some(&branch.base), self.admin.live())?;
        let marker = meta.text()?;
        {
            let mut slot = self.admin.slot().await;
            let admin = self.admin.client(&mut slot).await?;
            if db_meta(admin, &ident).await?.is_none() {
                return Err(Error::NotFound(format!("branch {}", branch.name)));
            }
            drop_db(admin, &ident).await?;
            self.copy_base(
                admin,
                &ident,
                &branch.base.id,
                &marker,
                "re-creating a branch",
            )
            .await?;
        }
        let fresh = Branch {
            created_at: meta.created_at(),
            ..branch.clone()
        };
        self.wait_login(&fresh).await?;
        Ok(fresh)
    }

    /// Deletes branch `name` (database and role); a missing branch is fine.
    pub(super) async fn delete_impl(&self, name: &str) -> Result<()> {
        validate_branch_name(name)?;
        let ident = db_ident(name);
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        self.delete_ident(admin, &ident).await?;
        self.secrets.remove(name);
        Ok(())
    }

    /// Drops database and role `ident` when they carry our marker; refuses a foreign one.
    pub(super) async fn delete_ident(&self, admin: &Client, ident: &str) -> Result<()> {
        match db_lookup(admin, ident).await? {
            None => {}
            Some(None) => {
                return Err(Error::PermissionDenied(format!(
                    "database {ident} was not created by Consort; not touching it"
                )));
            }
            Some(Some(_)) => drop_db(admin, ident).await?,
        }
        if role_meta(admin, ident).await?.is_some()
            && let Err(e) = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(ident)))
                .await
            // Another process dropped it at the same moment (two sweeps, two lanes resuming:
            // PostgreSQL says "tuple concurrently deleted"): gone is what was asked for.
            && role_meta(admin, ident).await?.is_some()
        {
            return Err(Error::from_pg(format!("dropping role {ident}"), e));
        }
        Ok(())
    }
}

/// Whether SQLSTATE `code` says the server ran short of room or of its file system: classes
/// 53 (insufficient resources, such as a full disk) and 58 (system errors).
fn short_of_room(code: &str) -> bool {
    code.starts_with("53") || code.starts_with("58")
}
