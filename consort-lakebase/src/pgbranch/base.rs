//! Base templates ("golden" databases): built under a temporary name, filled as the owner
//! role, renamed, sealed, and pruned to the newest few.

use std::time::{Duration, Instant};

use consort_actors::ContentHash;
use tokio_postgres::Client;
use tokio_postgres::error::SqlState;
use tracing::{debug, info, warn};

use super::catalog::{CLOSED, dbs_named, drop_db, is_template, open_private};
use super::meta::{Liveness, Meta, unix_now};
use super::{BUILDING_PREFIX, ServerProvider, TEMPLATE_PREFIX};
use crate::error::{Error, Result};
use crate::migrate;
use crate::names::{quote_ident, random_tag};
use crate::provider::{BaseRef, BaseSpec};

/// Templates younger than this are never pruned (another provider may be copying one).
pub(super) const PRUNE_GRACE_SECS: i64 = 600;

/// The template name of the base with key `key` copied from the database `parent`: two
/// parents on one server never share a template, even for the same [`BaseSpec`].
fn template_name(parent: &str, key: &ContentHash) -> String {
    let hex = key.to_hex();
    let named = ContentHash::of_pieces([parent.as_bytes(), b"\0", hex.as_bytes()]);
    format!("{TEMPLATE_PREFIX}{}", &named.to_hex()[..24])
}

impl ServerProvider {
    /// Makes or reuses the base template of `spec`.
    pub(super) async fn prepare_base_impl(&self, spec: &BaseSpec) -> Result<BaseRef> {
        migrate::check_plan(&spec.migrations)?;
        let key = spec.key();
        let name = template_name(&self.target.parent, &key);
        let base = BaseRef {
            id: name.clone(),
            key,
        };
        let _building = self.base_lock.lock().await;
        {
            let mut slot = self.admin.slot().await;
            let admin = self.admin.client(&mut slot).await?;
            if is_template(admin, &name).await? {
                return Ok(base);
            }
        }
        // The name carries the builder's liveness key: a base whose builder was killed before it
        // was marked is still known as this provider's (see `sweep::sweep_leftovers`).
        let tmp = format!(
            "{BUILDING_PREFIX}{:08x}_{}",
            self.admin.live(),
            random_tag(12)
        );
        let meta = Meta::now(Some(&base), self.admin.live())?.text()?;
        {
            let mut slot = self.admin.slot().await;
            let admin = self.admin.client(&mut slot).await?;
            let sql = format!(
                "CREATE DATABASE {} TEMPLATE {} STRATEGY FILE_COPY{CLOSED}",
                quote_ident(&tmp),
                quote_ident(&self.target.parent)
            );
            self.admin
                .exec_busy(admin, &sql, "copying the parent into a new base")
                .await?;
            open_private(admin, &tmp, Some(&meta)).await?;
        }
        let built = self.fill_base(&tmp, spec).await;
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        if let Err(e) = built {
            let _ = drop_db(admin, &tmp).await;
            return Err(e);
        }
        if !self.rename_base(admin, &tmp, &name).await? {
            return Ok(base);
        }
        let q = quote_ident(&name);
        admin
            .batch_execute(&format!(
                "ALTER DATABASE {q} WITH IS_TEMPLATE true ALLOW_CONNECTIONS false; \
                 REVOKE CONNECT, TEMPORARY ON DATABASE {q} FROM PUBLIC"
            ))
            .await
            .map_err(|e| Error::from_pg("sealing the base template", e))?;
        info!(base = %name, migrations = spec.migrations.len(), "base template built");
        if let Err(e) = self.prune_templates(admin, &name).await {
            warn!(error = %consort_actors::error_chain(&e), "pruning old base templates");
        }
        Ok(base)
    }

    /// Renames the finished base `tmp` to `name`. `false` when another provider built the
    /// same base first (theirs is used once it is sealed; `tmp` is dropped). A template of that
    /// name left unsealed by a maker that is gone (killed between its rename and its seal) is
    /// dropped and the rename tried again.
    async fn rename_base(&self, admin: &Client, tmp: &str, name: &str) -> Result<bool> {
        let sql = format!(
            "ALTER DATABASE {} RENAME TO {}",
            quote_ident(tmp),
            quote_ident(name)
        );
        let deadline = Instant::now() + self.opts.busy_timeout;
        let outcome = loop {
            let err = match self
                .admin
                .exec_busy(admin, &sql, "renaming the new base")
                .await
            {
                Ok(()) => return Ok(true),
                Err(e) => e,
            };
            let taken = err.sqlstate().is_some_and(|c| {
                *c == SqlState::DUPLICATE_DATABASE || *c == SqlState::UNIQUE_VIOLATION
            });
            if !taken {
                break Err(err);
            }
            if is_template(admin, name).await? {
                break Ok(false);
            }
            if abandoned(admin, name).await? {
                warn!(base = %name, "dropping a base template its killed maker never sealed");
                let _ = drop_template(admin, name).await;
                continue;
            }
            if Instant::now() >= deadline {
                break Err(Error::TemplateBusy(format!(
                    "base {name} was built elsewhere but never sealed"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let _ = drop_db(admin, tmp).await;
        outcome
    }

    /// Applies the migrations and fixtures to the base being built (as the owner role, which
    /// may create schemas there; a project's psql scripts by psql, as that role too).
    async fn fill_base(&self, db: &str, spec: &BaseSpec) -> Result<()> {
        let mut c = self.admin.connect(db).await?;
        let owner = quote_ident(&self.opts.owner_role);
        if !self.target.manage_parent {
            let sql = if self.is_super {
                format!("ALTER SCHEMA public OWNER TO {owner}")
            } else {
                format!("GRANT USAGE, CREATE ON SCHEMA public TO {owner}")
            };
            if let Err(e) = c.batch_execute(&sql).await {
                warn!(error = %consort_actors::error_chain(&e), "could not give the base's public schema to the owner role");
            }
        }
        // The base is Consort's own copy: its migrations may create schemas.
        c.batch_execute(&format!(
            "GRANT CREATE ON DATABASE {} TO {owner}",
            quote_ident(db)
        ))
        .await
        .map_err(|e| Error::from_pg("letting the owner role create schemas in the base", e))?;
        c.batch_execute(&format!("SET ROLE {owner}"))
            .await
            .map_err(|e| Error::from_pg("switching to the owner role", e))?;
        migrate::apply_with_psql(&mut c, &spec.migrations, self.psql_target(db).as_ref()).await?;
        for (i, fx) in spec.fixtures.iter().enumerate() {
            c.batch_execute(fx).await.map_err(|e| Error::Migration {
                version: format!("fixture #{}", i + 1),
                detail: match e.as_db_error() {
                    Some(db) => crate::error::db_text(db),
                    None => consort_actors::error_chain(&e),
                },
            })?;
        }
        Ok(())
    }

    /// Drops our oldest templates beyond `max_templates` (never `keep`, never a young one).
    async fn prune_templates(&self, admin: &Client, keep: &str) -> Result<()> {
        let mut ours: Vec<(i64, String)> = templates(admin)
            .await?
            .into_iter()
            .filter(|(name, _)| name != keep)
            .map(|(name, meta)| (meta.created, name))
            .collect();
        ours.sort_by_key(|o| std::cmp::Reverse(o.0));
        let recent = unix_now().saturating_sub(PRUNE_GRACE_SECS);
        for (created, name) in ours
            .into_iter()
            .skip(self.opts.max_templates.saturating_sub(1))
        {
            if created > recent {
                continue;
            }
            if drop_template(admin, &name).await.is_ok() {
                debug!(template = %name, "old base template dropped");
            }
        }
        Ok(())
    }
}

/// Whether the unsealed database `name` is a base whose maker is gone.
async fn abandoned(admin: &Client, name: &str) -> Result<bool> {
    let Some(meta) = super::catalog::db_meta(admin, name).await? else {
        return Ok(false);
    };
    Ok(meta.owner_gone(&Liveness::read(admin).await?))
}

/// Our base templates on the server, with their markers; sealed or not (a maker killed between
/// its rename and its seal leaves one unsealed).
pub(super) async fn templates(admin: &Client) -> Result<Vec<(String, Meta)>> {
    let named = dbs_named(admin, TEMPLATE_PREFIX, "listing base templates").await?;
    Ok(named
        .into_iter()
        .filter_map(|(db, marker)| Some((db, Meta::parse(marker.as_deref())?)))
        .collect())
}

/// Drops base template `name` (a template must be unmarked as one first).
pub(super) async fn drop_template(admin: &Client, name: &str) -> Result<()> {
    admin
        .batch_execute(&format!(
            "ALTER DATABASE {} WITH IS_TEMPLATE false",
            quote_ident(name)
        ))
        .await
        .map_err(|e| Error::from_pg(format!("unmarking base template {name}"), e))?;
    drop_db(admin, name).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_template_name_depends_on_the_parent_as_well_as_the_base() {
        let key = BaseSpec::default().key();
        let a = template_name("consort", &key);
        assert!(a.starts_with(TEMPLATE_PREFIX));
        assert_eq!(a, template_name("consort", &key));
        assert_ne!(a, template_name("other", &key));
        assert_ne!(a, template_name("consort", &ContentHash::of_bytes(b"x")));
    }
}
