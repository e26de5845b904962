//! Listing our branches, keeping one for inspection, and sweeping: by age, or the orphans of
//! processes that are gone (plus roles and bases such a process left half-made).
//!
//! What a kill may leave at any instant, and what finds it: a statement still running on the
//! server for the killed process (its sessions are ended first, `end_outliving_sessions`), a
//! role without its database (the role's marker), a database without its comment (its owner
//! role's marker, `DB_MARKER`), a base being built (its marker, or the builder's liveness key
//! in its name), a template no branch uses (the full sweep). A process is gone when its own
//! host says so, or, from any host, when its provider holds no liveness lock
//! (`meta::Liveness`).

use std::collections::{BTreeSet, HashSet};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio_postgres::Client;
use tracing::{info, warn};

use super::catalog::{DB_MARKER, comment_db, db_meta, dbs_named, drop_db};
use super::meta::{LIVE_CLASS, Liveness, Meta, unix_now, unix_secs};
use super::{BUILDING_PREFIX, ServerProvider};
use crate::error::{Error, Result};
use crate::names::{BRANCH_PREFIX, branch_of_db, db_ident, quote_ident, validate_branch_name};
use crate::provider::{BaseRef, Branch};

impl ServerProvider {
    /// Our branches with their markers.
    async fn list_meta(&self, admin: &Client) -> Result<Vec<(Branch, Meta)>> {
        let rows = admin
            .query(
                &format!(
                    "SELECT d.datname, {DB_MARKER} FROM pg_database d \
                     WHERE NOT d.datistemplate AND d.datname LIKE 'consort\\_%'"
                ),
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
        self.sweep_where(|b, _, _| b.created_at <= cutoff, Templates::Unused)
            .await
    }

    /// Deletes the branches no live process holds: those whose owner is gone and those kept
    /// for inspection, whatever their keep time; then the templates no branch uses.
    pub(super) async fn sweep_unheld_impl(&self) -> Result<usize> {
        self.sweep_where(
            |_, m, live| m.kept_until.is_some() || m.owner_gone(live),
            Templates::Unused,
        )
        .await
    }

    /// Deletes the branches whose owner is gone, that passed the age limit, or whose
    /// inspection time is over.
    pub(super) async fn sweep_orphans_impl(&self) -> Result<usize> {
        let now = unix_now();
        // An age limit beyond what i64 seconds hold means "no age limit": it saturates.
        let max_age = i64::try_from(self.opts.orphan_max_age.as_secs()).unwrap_or(i64::MAX);
        self.sweep_where(
            |_, m, live| match m.kept_until {
                Some(until) => until <= now,
                None => m.owner_gone(live) || now.saturating_sub(m.created) >= max_age,
            },
            Templates::Kept,
        )
        .await
    }

    async fn sweep_where(
        &self,
        doomed: impl Fn(&Branch, &Meta, &Liveness) -> bool,
        templates: Templates,
    ) -> Result<usize> {
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        let mut live = Liveness::read(admin).await?;
        if end_outliving_sessions(admin, &live).await? {
            live = Liveness::read(admin).await?;
        }
        let mut n = 0;
        let mut in_use = HashSet::new();
        for (branch, meta) in self.list_meta(admin).await? {
            if !(branch.name.starts_with(BRANCH_PREFIX) && doomed(&branch, &meta, &live)) {
                in_use.insert(branch.base.id);
                continue;
            }
            match self.delete_ident(admin, &branch.id).await {
                Ok(()) => n += 1,
                Err(e) => {
                    in_use.insert(branch.base.id);
                    warn!(branch = %branch.name, error = %consort_actors::error_chain(&e), "sweeping a branch")
                }
            }
        }
        sweep_leftovers(admin, &live).await?;
        if templates == Templates::Unused {
            sweep_templates(admin, &live, &in_use).await?;
        }
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

/// Whether a sweep also drops the base templates no branch uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Templates {
    /// The start-up sweep: templates are the cache later runs start from.
    Kept,
    /// The full sweep: a template no remaining branch uses goes, unless its maker is alive
    /// and it is younger than the pruning grace (it may be about to be copied).
    Unused,
}

/// The liveness key in the name of a base being built (`consorttmp_<key>_<tag>`).
fn builder_key(db: &str) -> Option<u32> {
    let (hex, _) = db.strip_prefix(BUILDING_PREFIX)?.split_once('_')?;
    u32::from_str_radix(hex, 16).ok()
}

/// How long a sweep waits for each session of a killed process it ends.
const END_SESSION_WAIT_MS: i64 = 10_000;

/// Ends the server sessions a killed process left busy, and waits for them: a statement it sent
/// goes on after it died (a `CREATE DATABASE` finishes and commits), so what it would leave is
/// judged only once nothing of it still runs. Only this host can tell that a process whose
/// key the server still holds is gone. Returns whether it ended any.
async fn end_outliving_sessions(admin: &Client, live: &Liveness) -> Result<bool> {
    let rows = admin
        .query(
            &format!(
                "SELECT shobj_description(r.oid, 'pg_authid') FROM pg_roles r \
                 WHERE r.rolname LIKE 'consort\\_%' \
                 UNION ALL SELECT {DB_MARKER} FROM pg_database d WHERE d.datname LIKE 'consort%'"
            ),
            &[],
        )
        .await
        .map_err(|e| Error::from_pg("reading the markers of what killed processes made", e))?;
    let keys: BTreeSet<u32> = rows
        .iter()
        .filter_map(|r| Meta::parse(r.get::<_, Option<&str>>(0))?.outlived_key(live))
        .collect();
    for key in &keys {
        warn!(
            key,
            "ending the server sessions a killed process left running"
        );
        let ended = admin
            .query(
                "SELECT pg_terminate_backend(pid, $3) FROM pg_locks \
                 WHERE locktype = 'advisory' AND classid = $1::int4::oid \
                 AND objid = $2::int8::oid AND objsubid = 2 AND granted \
                 AND pid <> pg_backend_pid()",
                &[&LIVE_CLASS, &i64::from(*key), &END_SESSION_WAIT_MS],
            )
            .await;
        if let Err(e) = ended {
            warn!(key, error = %consort_actors::error_chain(&e), "could not end a killed process's sessions; what they make is swept later");
        }
    }
    Ok(!keys.is_empty())
}

/// Roles left without a database (a create interrupted; a migration tool's login to the
/// parent whose promotion was killed), and bases never finished, of processes that are gone. Failing drops are left for the next sweep.
async fn sweep_leftovers(admin: &Client, live: &Liveness) -> Result<()> {
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
        let Some(meta) = Meta::parse(r.get::<_, Option<&str>>(1)) else {
            continue;
        };
        if !meta.owner_gone(live) {
            continue;
        }
        if role.starts_with(super::promote::PROMOTION_ROLE_PREFIX) {
            let _ = super::promote::drop_promotion_role(admin, &role).await;
        } else if branch_of_db(&role).is_some() {
            let _ = admin
                .batch_execute(&format!("DROP ROLE IF EXISTS {}", quote_ident(&role)))
                .await;
        }
    }
    for (db, marker) in dbs_named(admin, BUILDING_PREFIX, "listing unfinished bases").await? {
        let gone = match Meta::parse(marker.as_deref()) {
            Some(m) => m.owner_gone(live),
            // Killed before its marker: the builder's key is in the name.
            None => builder_key(&db).is_some_and(|k| !live.holds(k)),
        };
        if gone {
            let _ = drop_db(admin, &db).await;
        }
    }
    Ok(())
}

/// Drops the base templates no branch uses (`in_use`), except a young one whose maker is
/// alive. Failing drops are left for the next sweep.
async fn sweep_templates(admin: &Client, live: &Liveness, in_use: &HashSet<String>) -> Result<()> {
    let recent = unix_now().saturating_sub(super::base::PRUNE_GRACE_SECS);
    for (name, meta) in super::base::templates(admin).await? {
        if in_use.contains(&name) || (meta.created > recent && !meta.owner_gone(live)) {
            continue;
        }
        if let Err(e) = super::base::drop_template(admin, &name).await {
            warn!(template = %name, error = %consort_actors::error_chain(&e), "sweeping a base template");
        }
    }
    Ok(())
}
