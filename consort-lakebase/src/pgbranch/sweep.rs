//! Listing our branches, keeping one for inspection, and sweeping: by age, or the orphans of
//! processes that are gone (plus roles and bases such a process left half-made).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;
use tracing::{info, warn};

use super::ServerProvider;
use super::catalog::{comment_db, db_meta, drop_db};
use super::meta::{Meta, unix_now, unix_secs};
use crate::error::{Error, Result};
use crate::names::{BRANCH_PREFIX, branch_of_db, db_ident, quote_ident, validate_branch_name};
use crate::provider::{BaseRef, Branch};

impl ServerProvider {
    /// Our branches with their markers.
    async fn list_meta(&self, admin: &Client) -> Result<Vec<(Branch, Meta)>> {
        let rows = admin
            .query(
                "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
                 WHERE NOT datistemplate AND datname LIKE 'consort\\_%'",
                &[],
            )
            .await
            .map_err(|e| Error::from_pg("listing branches", e))?;
        Ok(rows
            .iter()
            .filter_map(|r| {
                let db: String = r.get(0);
                let name = branch_of_db(&db)?;
                let meta = Meta::parse(r.get::<_, Option<&str>>(1))?;
                let key = meta.key.as_deref()?.parse().ok()?;
                let branch = Branch {
                    name,
                    id: db,
                    base: BaseRef {
                        id: meta.base.clone()?,
                        key,
                    },
                    created_at: meta.created_at(),
                };
                Some((branch, meta))
            })
            .collect())
    }

    /// Our branches whose name starts with `prefix`, by name.
    pub(super) async fn list_impl(&self, prefix: &str) -> Result<Vec<Branch>> {
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        let mut out: Vec<Branch> = self
            .list_meta(admin)
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .filter(|b| b.name.starts_with(prefix))
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    /// Deletes every branch created `older_than` ago or earlier.
    pub(super) async fn sweep_impl(&self, older_than: Duration) -> Result<usize> {
        // An age reaching back before 1970 is "older than anything": the cutoff saturates.
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .unwrap_or(UNIX_EPOCH);
        self.sweep_where(|b, _| b.created_at <= cutoff).await
    }

    /// Deletes the branches whose owner is gone, that passed the age limit, or whose
    /// inspection time is over.
    pub(super) async fn sweep_orphans_impl(&self) -> Result<usize> {
        let now = unix_now();
        // An age limit beyond what i64 seconds hold means "no age limit": it saturates.
        let max_age = i64::try_from(self.opts.orphan_max_age.as_secs()).unwrap_or(i64::MAX);
        self.sweep_where(|_, m| match m.kept_until {
            Some(until) => until <= now,
            None => m.owner_gone() || now.saturating_sub(m.created) >= max_age,
        })
        .await
    }

    async fn sweep_where(&self, doomed: impl Fn(&Branch, &Meta) -> bool) -> Result<usize> {
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        let mut n = 0;
        for (branch, meta) in self.list_meta(admin).await? {
            if branch.name.starts_with(BRANCH_PREFIX) && doomed(&branch, &meta) {
                match self.delete_ident(admin, &branch.id).await {
                    Ok(()) => n += 1,
                    Err(e) => {
                        warn!(branch = %branch.name, error = %consort_actors::error_chain(&e), "sweeping a branch")
                    }
                }
            }
        }
        sweep_leftovers(admin).await?;
        if n > 0 {
            info!(swept = n, "swept branches");
        }
        Ok(n)
    }

    /// Marks the branch to be kept (not swept as an orphan) until `until`.
    pub(super) async fn keep_for_inspection_impl(
        &self,
        branch: &Branch,
        until: SystemTime,
    ) -> Result<()> {
        validate_branch_name(&branch.name)?;
        let ident = db_ident(&branch.name);
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        let mut meta = db_meta(admin, &ident)
            .await?
            .ok_or_else(|| Error::NotFound(format!("branch {}", branch.name)))?;
        meta.kept_until = Some(unix_secs(until));
        comment_db(admin, &ident, &meta.text()?).await
    }
}

/// Roles left without a database (a create interrupted), and bases never finished, of
/// processes that are gone. Failing drops are left for the next sweep.
async fn sweep_leftovers(admin: &Client) -> Result<()> {
    let roles = admin
        .query(
            "SELECT r.rolname, shobj_description(r.oid, 'pg_authid') FROM pg_roles r \
             WHERE r.rolname LIKE 'consort\\_%' \
             AND NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.datname = r.rolname)",
            &[],
        )
        .await
        .map_err(|e| Error::from_pg("listing branch roles", e))?;
    for r in roles {
        let role: String = r.get(0);
        if let Some(meta) = Meta::parse(r.get::<_, Option<&str>>(1))
            && branch_of_db(&role).is_some()
            && meta.owner_gone()
        {
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&role)))
                .await;
        }
    }
    let building = admin
        .query(
            "SELECT datname, shobj_description(oid, 'pg_database') FROM pg_database \
             WHERE datname LIKE 'consorttmp\\_%'",
            &[],
        )
        .await
        .map_err(|e| Error::from_pg("listing unfinished bases", e))?;
    for r in building {
        let db: String = r.get(0);
        if Meta::parse(r.get::<_, Option<&str>>(1)).is_some_and(|m| m.owner_gone()) {
            let _ = drop_db(admin, &db).await;
        }
    }
    Ok(())
}
