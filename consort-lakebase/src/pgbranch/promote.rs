//! Promote: the approved migrations applied to the parent (as the owner role) and verified.

use consort_actors::Migration;
use tracing::{info, warn};

use super::ServerProvider;
use crate::error::{Error, Result};
use crate::migrate;
use crate::names::quote_ident;
use crate::provider::PromoteOutcome;

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
