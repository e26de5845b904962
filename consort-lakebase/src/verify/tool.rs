//! The project's own migration tool in a verification and a promotion (see
//! [`crate::migrate::MigrationTool`]).
//!
//! On a branch it runs once the run's context (login, confinement) is made and before any
//! test: a tool that fails is the base's fault, never a verdict. At promotion it runs on the
//! parent through a short-lived login acting as the owner role
//! ([`crate::BranchProvider::parent_login`]), from the feature's work tree, which holds
//! exactly the frozen files (the conductor checked them before asking).

use consort_actors::{InfraError, InfraFault, PromoteReport, PromoteRequest, VerifyRequest};
use tracing::info;

use super::{Verifier, infra};
use crate::error::Error;
use crate::migrate::MigrationTool;
use crate::runner::RunContext;

impl Verifier {
    /// Applies the project's migrations with `tool` on the branch of `ctx`, and checks that
    /// its bookkeeping holds the design's migrations `req` asks for.
    pub(super) async fn apply_tool(
        &self,
        tool: &MigrationTool,
        req: &VerifyRequest,
        ctx: &RunContext,
    ) -> Result<(), InfraError> {
        let done = tool
            .apply(ctx, &req.tool_records)
            .await
            .map_err(|e| tool_fault(&e))?;
        info!(request = %req.id, tool = %tool.name, ms = done.ms, "migration tool applied");
        Ok(())
    }

    /// Promotion by the project's migration tool: applied to the parent, then checked in its
    /// bookkeeping.
    pub(super) async fn promote_by_tool(
        &self,
        tool: &MigrationTool,
        req: &PromoteRequest,
    ) -> Result<PromoteReport, InfraError> {
        let Some(tree) = req.work_tree.clone() else {
            return Err(infra(
                InfraFault::MigrationFailed,
                "promote: the request names no work tree for the project's migration tool to apply",
            ));
        };
        let login = self.provider().parent_login().await.map_err(|e| {
            infra(
                e.infra_fault(),
                format!("promote: {}", consort_actors::error_chain(&e)),
            )
        })?;
        let target = login.conn.database.clone();
        let mut hidden = vec![tree.join(".consort")];
        hidden.extend(self.provider().private_paths());
        let applied =
            match RunContext::prepare(tree, login.conn.clone(), self.sandbox, hidden, Vec::new()) {
                Ok(ctx) => tool.apply(&ctx, &req.tool_records).await,
                Err(e) => Err(e),
            };
        if let Err(e) = self.provider().drop_parent_login(&login).await {
            tracing::warn!(error = %consort_actors::error_chain(&e), "the migration tool's login to the parent stays until it expires");
        }
        let done = applied.map_err(|e| {
            infra(
                e.infra_fault(),
                format!("promote: {}", consort_actors::error_chain(&e)),
            )
        })?;
        info!(parent = %target, tool = %tool.name, applied = done.applied.len(), "promoted by the project's migration tool");
        let (applied, already_applied) = versions_applied(req, &done);
        Ok(PromoteReport {
            request_id: req.id,
            target,
            applied,
            already_applied,
            verified: true,
            merge_check: None,
        })
    }
}

/// The design's versions the tool applied now, and those the parent held already, from its
/// records: one record per migration (Knex, Django, dbmate) says so for each; a tool that
/// keeps only its head (Alembic) says so for all of them at once.
fn versions_applied(
    req: &PromoteRequest,
    done: &crate::migrate::ToolApplied,
) -> (Vec<String>, Vec<String>) {
    let versions = || req.migrations.iter().map(|m| m.version.clone());
    if req.tool_records.len() == req.migrations.len() {
        let (mut applied, mut already) = (Vec::new(), Vec::new());
        for (version, record) in versions().zip(&req.tool_records) {
            if done.applied.contains(record) {
                applied.push(version);
            } else {
                already.push(version);
            }
        }
        (applied, already)
    } else if done.applied.is_empty() {
        (Vec::new(), versions().collect())
    } else {
        (versions().collect(), Vec::new())
    }
}

/// A tool that failed on a branch: the base could not be built, so no test ran (as
/// `base_not_built` says for SQL), with what a person can do about a tool; one that could not
/// even start is the runner's kind of fault.
fn tool_fault(e: &Error) -> InfraError {
    match e {
        Error::MigrationTool { .. } => infra(
            InfraFault::MigrationFailed,
            format!(
                "no test ran: the database branch could not be built: {}. No agent can change the project's migration tool or the approved design's migrations: when the tool's command or its reading of the branch is wrong, fix [migrations] (and [branch_env], the names the project reads the branch under) in consort.toml, where the change is recorded as a person's decision, and `consort retry`; when the approved migration itself is wrong, `consort stop` the feature and request it again",
                consort_actors::error_chain(e)
            ),
        ),
        other => infra(
            other.infra_fault(),
            format!(
                "the project's migration tool could not run: {}",
                consort_actors::error_chain(other)
            ),
        ),
    }
}
