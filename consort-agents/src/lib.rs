//! The eight Consort role actors and their swappable agent backends.
//!
//! Each role of the ensemble (Product Owner, Spec Author, Architect Reviewer, DBA, Test
//! Strategist, UX Designer, Navigator, Driver) is played by a [`RoleActor`]: a ractor actor that
//! receives [`RoleMsg::Assign`] from the conductor and replies with a [`Produced`] artifact
//! stamped with its [`ActorId`], or a typed [`AgentFailure`]. The actor wraps an [`Agent`], the
//! one trait a user implements to bring their own agent. Four backends come with the crate:
//!
//! - [`OpenAiAgent`]: any OpenAI-compatible chat-completions server (async-openai), with the
//!   role's system prompt, structured output from the artifact's JSON schema, validation with
//!   the error fed back, HTTP retries that honour `Retry-After`, and token and time budgets.
//! - [`ScriptedAgent`]: deterministic answers from a JSON or TOML [`Script`] (format below and
//!   in `SCRIPTS.md`).
//! - [`ExternalCommandAgent`]: a program run in a scratch copy of the work tree; its answer is
//!   JSON on stdout or, for change-set steps, the files it changed. A [`Preset`] runs a
//!   coding-agent CLI (Claude Code, Codex, aider) with its documented command line and the
//!   role's prompt plus the assignment as its prompt ([`cli_prompt`]).
//! - [`McpAgent`]: a coding client connected through `consort mcp` takes the parked
//!   assignment from a [`mcp::Mailbox`] and submits the answer, judged like any other.
//!
//! **Architecture invariant:** no role actor has a handle on the work tree, the database or
//! another actor. It gets an assignment and answers with an artifact; the conductor decides
//! what happens to it. A role actor refuses to answer a step that is not its role's
//! ([`AgentFailure::WrongRole`]) and refuses an artifact of a kind the step does not call for
//! ([`AgentFailure::KindNotAllowed`]): a Driver cannot produce a test list, and nobody can
//! produce a test-run receipt.
//!
//! # Bring your own agent
//!
//! Implement [`Agent::act`], wrap the agent in a [`RoleActor`], and send it assignments:
//!
//! ```
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use consort_actors::{
//!     ActorId, AgentFailure, Artifact, Assignment, AssignmentId, AssignmentInputs,
//!     ReviewVerdict, Step,
//! };
//! use consort_agents::{Agent, AgentOutput, BoxFuture, Role, RoleArgs, assign, spawn_role};
//!
//! /// A reviewer that asks for one refactor, then approves.
//! struct TwoRoundReviewer;
//!
//! impl Agent for TwoRoundReviewer {
//!     fn act<'a>(&'a self, a: &'a Assignment) -> BoxFuture<'a, Result<AgentOutput, AgentFailure>> {
//!         Box::pin(async move {
//!             let verdict = match a.step {
//!                 Step::Review { round: 0, .. } => ReviewVerdict::ChangesRequested {
//!                     reasons: vec!["extract the query into a function".into()],
//!                 },
//!                 _ => ReviewVerdict::Approve { notes: vec![] },
//!             };
//!             Ok(AgentOutput::new(Artifact::ReviewVerdict(verdict)))
//!         })
//!     }
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let id = ActorId::new(Role::Navigator, "navigator");
//! let args = RoleArgs::new(id.clone(), Arc::new(TwoRoundReviewer))
//!     .with_timeout(Duration::from_secs(30));
//! let (actor, handle) = spawn_role(args).await.expect("spawned");
//!
//! let review = Assignment {
//!     id: AssignmentId(7),
//!     role: Role::Navigator,
//!     step: Step::Review { test: "T1".into(), round: 0 },
//!     attempt: 0,
//!     runner: None,
//!     writes: None,
//!     inputs: AssignmentInputs::default(),
//!     feedback: vec![],
//!     budget: None,
//!     tools: None,
//! };
//! let produced = assign(&actor, review, None).await.expect("replied").expect("produced");
//! assert_eq!(produced.author, id);
//! assert!(matches!(
//!     produced.artifact,
//!     Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested { .. })
//! ));
//!
//! // The same actor refuses a step that is not the Navigator's.
//! let green = Assignment {
//!     id: AssignmentId(8),
//!     role: Role::Navigator,
//!     step: Step::Green { test: "T1".into() },
//!     attempt: 0,
//!     runner: None,
//!     writes: None,
//!     inputs: AssignmentInputs::default(),
//!     feedback: vec![],
//!     budget: None,
//!     tools: None,
//! };
//! let refused = assign(&actor, green, None).await.expect("replied");
//! assert!(matches!(refused, Err(AgentFailure::WrongRole { .. })));
//!
//! actor.stop(None);
//! handle.await.expect("stopped");
//! # }
//! ```
//!
//! # Choosing backends from configuration
//!
//! [`AgentConfig`] is a serde enum tagged by `backend` (`openai`, `script`, `command`) whose
//! fields are [`OpenAiConfig`], the script paths, or [`CommandConfig`];
//! [`AgentConfig::build`] turns it into an `Arc<dyn Agent>` for a role.
//!
//! # Scripts
//!
//! The full format is in [`script_format`]. In short, a TOML script is a list of entries, each
//! answering one step (a key like `red/T1`, or a pattern like `review/*/*`) with an artifact:
//!
//! ```
//! # use consort_agents::{Role, Script};
//! # use consort_actors::Step;
//! let script = Script::from_toml_str(r#"
//!     [[entry]]
//!     step = "review/*/*"
//!     artifact = { kind = "review-verdict", body = { decision = "approve" } }
//! "#).expect("valid script");
//! let entry = script
//!     .lookup(Role::Navigator, &"review/T4/2".parse::<Step>().expect("step key"), 0)
//!     .expect("answered");
//! assert_eq!(entry.artifact.kind().to_string(), "review-verdict");
//! ```

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

mod actor;
mod agent;
mod command;
mod config;
pub mod mcp;
pub mod openai;
pub mod prompts;
mod reference;
mod script;
mod skeleton;
pub mod validate;

pub use actor::{
    DEFAULT_TIMEOUT, RoleActor, RoleArgs, RoleState, assign, identify, spawn_role,
    spawn_role_linked,
};
pub use agent::{ActFuture, Agent, AgentOutput, AsyncAgent, BoxFuture};
pub use command::{
    CommandConfig, CommandError, ExternalCommandAgent, FILES_PLACEHOLDER, PROMPT_PLACEHOLDER,
    Preset, TRANSCRIPT_STREAM_CAP, cli_prompt, transcript_file_name,
};
pub use config::{AgentConfig, Error};
pub use consort_actors::{
    ActorId, AgentFailure, Assignment, Produced, Role, RoleMsg, RoleReply, Usage,
};
pub use mcp::{McpAgent, McpConfig};
pub use openai::{
    ApiKey, Budget, HttpPolicy, OpenAiAgent, OpenAiConfig, OpenAiConfigError, ToolProtocol,
};
pub use reference::artifact_reference;
pub use script::{Script, ScriptEntry, ScriptError, ScriptedAgent, StepPattern};
pub use skeleton::{PLACEHOLDER, field_list, placeholders, script_skeleton};

#[doc = include_str!("../SCRIPTS.md")]
pub mod script_format {}
