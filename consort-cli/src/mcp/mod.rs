//! `consort mcp`: an MCP server over stdio, so a coding client (Claude Code, Cursor, Codex, …)
//! can read a project's state and play the roles configured `backend = "mcp"`.
//!
//! The read tools (`status`, `next`, `design`, `log`, `verify`, `branches`) return what the
//! CLI prints, from the same functions ([`crate::views`]). The role-play tools
//! (`next_assignment`, `submit`, in `play`) work on the feature's mailbox
//! ([`consort_agents::mcp::Mailbox`]), where `consort run` parks the assignments of those
//! roles. `approve` is offered only when `[mcp] approve = true`, and records exactly as
//! `consort approve` does. Each session plays one declared identity (`--as NAME`, or the
//! client's declared name). Every failure is answered as a tool error in plain words.
//! [`install`] writes a client's configuration that starts this server.

pub mod install;
mod play;
mod tools;

use std::path::PathBuf;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ServerCapabilities, ServerConfig,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::Value;

use crate::views::{DecideError, ViewError};
use consort::project::{Project, ProjectError};
use consort_agents::mcp::{MailboxError, check_identity};

/// Why a tool call was refused or failed; its text is what the client reads.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// No such tool (or `approve` while the configuration does not offer it).
    #[error("there is no tool {0} here")]
    UnknownTool(String),
    /// An answer could not be written as JSON.
    #[error("cannot write the answer as JSON")]
    Encode(#[from] serde_json::Error),
    /// The arguments do not fit the tool.
    #[error("bad arguments for {tool}: {detail}")]
    BadArguments {
        /// The tool.
        tool: String,
        /// What is wrong.
        detail: String,
    },
    /// The session has no identity.
    #[error(
        "this session has no identity: start it as `consort mcp --as NAME` (or give the client a plain name)"
    )]
    NoIdentity,
    /// A view failed.
    #[error(transparent)]
    View(#[from] ViewError),
    /// The project could not be opened.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// The mailbox refused or failed.
    #[error(transparent)]
    Mailbox(#[from] MailboxError),
    /// A gate decision was refused.
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// The role is not played through MCP in this project.
    #[error(
        "the {role} is not played through MCP in this project; configure [agents.roles.{role}] backend = \"mcp\""
    )]
    NotAnMcpRole {
        /// The role asked for.
        role: consort_actors::Role,
    },
    /// The session's identity wrote the code it would review.
    #[error(
        "refused: {identity} wrote the code under review for {test} (its {steps}); the author never reviews its own code, so another identity must take this review"
    )]
    AuthorReviews {
        /// The session's identity.
        identity: String,
        /// The test-list entry.
        test: String,
        /// The code steps that identity answered.
        steps: String,
    },
    /// The run refused a submission.
    #[error("refused: {reason} ({left})")]
    Refused {
        /// The reason, word for word.
        reason: String,
        /// What is left.
        left: String,
    },
}

/// The server: one project (every feature it drives, or one), one identity.
#[derive(Debug, Clone)]
pub struct ConsortMcp {
    dir: PathBuf,
    feature: Option<String>,
    identity: Option<String>,
}

impl ConsortMcp {
    /// A server for the project in `dir` (its current feature, or `feature`), playing as
    /// `identity` when given.
    pub fn new(dir: PathBuf, feature: Option<String>, identity: Option<String>) -> Self {
        ConsortMcp {
            dir,
            feature,
            identity,
        }
    }

    fn project(&self) -> Result<Project, ToolError> {
        Ok(Project::open_feature(&self.dir, self.feature.as_deref())?)
    }

    /// The features a role-play call may play in: the one `asked` for, else the server's own
    /// (`--feature`), else every unfinished feature of the backlog (each lane of `consort run
    /// --parallel N`), in backlog order.
    fn features_to_play(&self, asked: Option<&str>) -> Result<Vec<Project>, ToolError> {
        if let Some(id) = asked.or(self.feature.as_deref()) {
            return Ok(vec![Project::open_feature(&self.dir, Some(id))?]);
        }
        let project = self.project()?;
        let mut out = Vec::new();
        for feature in project.backlog()? {
            if project.state_of(&feature)?.is_unfinished() {
                out.push(Project::open_feature(&self.dir, Some(&feature.id))?);
            }
        }
        if out.is_empty() {
            out.push(project);
        }
        Ok(out)
    }

    /// Whether the configuration offers the `approve` tool (read at each call).
    fn approve_offered(&self) -> bool {
        self.project().is_ok_and(|p| p.config.mcp.approve)
    }

    /// The session's identity: `--as`, else the client's declared name if it is a plain name.
    fn identity(&self, context: &RequestContext<RoleServer>) -> Result<String, ToolError> {
        if let Some(id) = &self.identity {
            return Ok(id.clone());
        }
        let declared = context
            .peer
            .peer_info()
            .map(|info| info.client_info.name.clone());
        match declared {
            Some(name) if check_identity(&name).is_ok() => Ok(name),
            _ => Err(ToolError::NoIdentity),
        }
    }

    async fn dispatch(
        &self,
        name: &str,
        args: serde_json::Map<String, Value>,
        context: &RequestContext<RoleServer>,
    ) -> Result<String, ToolError> {
        match name {
            "status" => {
                let report = crate::views::status_report(&self.project()?)?;
                Ok(serde_json::to_string_pretty(&report)?)
            }
            "next" => {
                let who = self.identity(context).ok();
                Ok(crate::views::next_text(&self.project()?, who.as_deref())?)
            }
            "design" => Ok(crate::views::design_text(&self.project()?)?),
            "log" => {
                let last = tools::parse::<tools::LogArgs>(name, args)?.last;
                let project = self.project()?;
                if !project
                    .has_started()
                    .map_err(crate::views::ViewError::from)?
                {
                    return Ok(format!(
                        "the ledger is empty: feature {} has not started",
                        project.feature_id()
                    ));
                }
                Ok(crate::views::log_text(&project, last)?)
            }
            "verify" => {
                let (ok, text) = crate::views::verify_text(&self.dir, self.feature.as_deref())?;
                let head = if ok {
                    "every check holds"
                } else {
                    "some checks FAIL"
                };
                Ok(format!("{head}\n{text}"))
            }
            "branches" => Ok(crate::views::branches_text(&self.project()?).await?),
            "next_assignment" => {
                let req = tools::parse::<tools::NextArgs>(name, args)?;
                let features = self.features_to_play(req.feature.as_deref())?;
                play::next_assignment(&features, &self.identity(context)?, req).await
            }
            "submit" => {
                let req = tools::parse::<tools::SubmitArgs>(name, args)?;
                let features = self.features_to_play(req.feature.as_deref())?;
                play::submit(&features, &self.identity(context)?, req).await
            }
            "approve" if self.approve_offered() => {
                let req = tools::parse::<tools::ApproveArgs>(name, args)?;
                let project = self.project()?;
                Ok(crate::views::decide_gate(
                    &project,
                    req.gate,
                    &req.hash,
                    &self.identity(context)?,
                    consort_actors::GateDecision::Approve,
                    req.note.unwrap_or_default(),
                )?)
            }
            other => Err(ToolError::UnknownTool(other.to_string())),
        }
    }
}

impl ServerHandler for ConsortMcp {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("consort", env!("CARGO_PKG_VERSION")))
            .with_instructions(
                "Consort drives a spec-first, test-driven run. `next` says what waits; roles \
                 configured `backend = \"mcp\"` are played with `next_assignment` and `submit`.",
            )
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(tools::list(
            self.approve_offered(),
        )))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let args = request.arguments.unwrap_or_default();
        let result = match self.dispatch(&request.name, args, &context).await {
            Ok(text) => CallToolResult::success(vec![ContentBlock::text(text)]),
            Err(e) => {
                tracing::info!(tool = %request.name, error = %consort_actors::error_chain(&e), "tool call refused");
                CallToolResult::error(vec![ContentBlock::text(consort_actors::error_chain(&e))])
            }
        };
        Ok(result.into())
    }
}

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The identity given is not a plain name.
    #[error(transparent)]
    Identity(#[from] MailboxError),
    /// The project could not be opened.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// The MCP session failed to start or ended with an error.
    #[error("MCP session: {0}")]
    Session(String),
}

/// Serves MCP over stdin and stdout until the client disconnects.
pub async fn serve(
    dir: PathBuf,
    feature: Option<String>,
    identity: Option<String>,
) -> Result<(), ServeError> {
    if let Some(id) = &identity {
        check_identity(id)?;
    }
    // Refused at once when there is no project, before a client is kept waiting.
    Project::open_feature(&dir, feature.as_deref())?;
    let server = ConsortMcp::new(dir, feature, identity);
    let running = server
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| ServeError::Session(e.to_string()))?;
    running
        .waiting()
        .await
        .map_err(|e| ServeError::Session(e.to_string()))?;
    Ok(())
}
