//! Promote: the approved migrations applied to the parent (as the owner role) and verified;
//! or, for a project's migration tool, a short-lived login to the parent as the owner role.

use consort_actors::Migration;
use tracing::{info, warn};

use super::ServerProvider;
use crate::error::{Error, Result};
use crate::migrate;
use crate::names::{quote_ident, quote_literal, random_password, random_tag};
use crate::provider::{ConnectInfo, ParentLogin, PromoteOutcome, Secret};

/// The prefix of a promotion login's role.
pub(super) const PROMOTION_ROLE_PREFIX: &str = "consort_promote_";

impl ServerProvider {
    /// Applies `migrations` to the parent and checks them there.
    pub(super) async fn promote_impl(&self, migrations: &[Migration]) -> Result<PromoteOutcome> {
        migrate::check_plan(migrations)?;
        let parent = self.target.parent.clone();
        let mut c = self.admin.connect(&parent).await?;
        let owner = quote_ident(&self.opts.owner_role);
        if !self.target.manage_parent {
            // Promote is the one sanctioned change to a parent Consort did not create. When the
            // grant is refused, `SET ROLE` and the migrations below report the real problem.
            let _ = c
                .batch_execute(&format!("GRANT USAGE, CREATE ON SCHEMA public TO {owner}"))
                .await;
        }
        c.batch_execute(&format!("SET ROLE {owner}"))
            .await
            .map_err(|e| Error::from_pg("switching to the owner role", e))?;
        let psql = self.psql_target(&parent);
        let (report, outcome) = migrate::apply_partial(&mut c, migrations, psql.as_ref()).await;
        let failure = match outcome {
            Ok(()) => None,
            Err(e @ (Error::Migration { .. } | Error::ChecksumMismatch { .. })) => {
                warn!(parent = %parent, error = %e, "promote stopped");
                Some(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let verified = failure.is_none() && migrate::verify(&c, migrations).await?;
        info!(parent = %parent, applied = report.applied.len(), verified, "promoted migrations");
        Ok(PromoteOutcome {
            target: parent,
            applied: report.applied,
            already_applied: report.already_applied,
            verified,
            failure,
        })
    }
}

impl ServerProvider {
    /// A login role for the parent: a member of the owner role whose every session acts as
    /// it (`ALTER ROLE … SET role`), so that what the project's migration tool creates belongs
    /// to the owner role as Consort's own promotion makes it; it may connect to the parent
    /// only, and expires within the hour even if it is never dropped.
    pub(super) async fn parent_login_impl(&self) -> Result<ParentLogin> {
        let role = format!("{PROMOTION_ROLE_PREFIX}{}", random_tag(12));
        let password = random_password();
        let verifier = crate::scram::verifier(password.as_bytes(), crate::scram::BRANCH_ITERATIONS);
        let parent = self.target.parent.clone();
        let (q, owner, db) = (
            quote_ident(&role),
            quote_ident(&self.opts.owner_role),
            quote_ident(&parent),
        );
        // The maker's marker: a login whose maker was killed is swept (`sweep::sweep_leftovers`).
        let marker = super::meta::Meta::now(None, self.admin.live())?.text()?;
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        if !self.target.manage_parent {
            let c = self.admin.connect(&parent).await?;
            let _ = c
                .batch_execute(&format!("GRANT USAGE, CREATE ON SCHEMA public TO {owner}"))
                .await;
        }
        let made = admin
            .batch_execute(&format!(
                "BEGIN; CREATE ROLE {q} LOGIN PASSWORD {} IN ROLE {owner}; \
                 DO $v$ BEGIN EXECUTE format('ALTER ROLE %I VALID UNTIL %L', {}, now() + interval '1 hour'); END $v$; \
                 ALTER ROLE {q} SET role = {}; GRANT CONNECT ON DATABASE {db} TO {q}; \
                 COMMENT ON ROLE {q} IS {}; COMMIT",
                quote_literal(&verifier),
                quote_literal(&role),
                quote_literal(&self.opts.owner_role),
                quote_literal(&marker),
            ))
            .await;
        if let Err(e) = made {
            let _ = admin.batch_execute("ROLLBACK").await;
            return Err(Error::from_pg(
                "making a login to the parent for the migration tool",
                e,
            ));
        }
        Ok(ParentLogin {
            conn: ConnectInfo {
                host: self.target.branch_host.clone(),
                port: self.target.branch_port,
                database: parent,
                user: role,
                secret: Secret::new(password),
                expires_at: None,
                sslmode: self.target.branch_ssl,
                ca_file: None,
            },
        })
    }

    /// Drops a promotion login (its sessions are over: the tool has exited).
    pub(super) async fn drop_parent_login_impl(&self, login: &ParentLogin) -> Result<()> {
        let role = &login.conn.user;
        if !role.starts_with(PROMOTION_ROLE_PREFIX) {
            return Err(Error::InvalidName(format!("{role} is no promotion login")));
        }
        let mut slot = self.admin.slot().await;
        let admin = self.admin.client(&mut slot).await?;
        drop_promotion_role(admin, role)
            .await
            .map_err(|e| Error::from_pg("dropping the migration tool's login to the parent", e))
    }
}

/// Drops a promotion login's role with the privileges it was granted (`DROP OWNED` revokes
/// those on databases too; it owns nothing, acting as the owner role).
pub(super) async fn drop_promotion_role(
    admin: &tokio_postgres::Client,
    role: &str,
) -> std::result::Result<(), tokio_postgres::Error> {
    let q = quote_ident(role);
    admin
        .batch_execute(&format!("DROP OWNED BY {q}; DROP ROLE IF EXISTS {q}"))
        .await
}
