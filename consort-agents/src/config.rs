//! Choosing a backend per role from configuration, and the crate's error type.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use consort_actors::Role;
use serde::{Deserialize, Serialize};

use crate::agent::Agent;
use crate::command::{CommandConfig, CommandError, ExternalCommandAgent};
use crate::mcp::{Mailbox, McpAgent, McpConfig};
use crate::openai::{OpenAiAgent, OpenAiConfig, OpenAiConfigError};
use crate::script::{Script, ScriptError};

/// Any error this crate returns outside the actor protocol (which uses
/// [`AgentFailure`](consort_actors::AgentFailure)).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A script file is unusable.
    #[error(transparent)]
    Script(#[from] ScriptError),
    /// An OpenAI-compatible configuration is unusable.
    #[error(transparent)]
    OpenAi(#[from] OpenAiConfigError),
    /// An external command failed.
    #[error(transparent)]
    Command(#[from] CommandError),
    /// A backend configuration is unusable.
    #[error("{role}: {detail}")]
    Config {
        /// The role configured.
        role: Role,
        /// What is wrong.
        detail: String,
    },
}

/// Which backend plays a role, as written in a configuration file.
///
/// ```toml
/// [roles.driver]
/// backend = "openai"
/// base_url = "http://127.0.0.1:8000/v1"
/// model = "qwen2.5-coder"
/// api_key_env = "LLM_KEY"
///
/// [roles.navigator]
/// backend = "script"
/// path = "scripts/stockflow.toml"
///
/// [roles.ux-designer]
/// backend = "command"
/// program = "./agents/ux.sh"
/// timeout_ms = 60000
///
/// [roles.dba]
/// backend = "command"
/// preset = "claude-code"
/// pass_env = ["PATH", "HOME", "ANTHROPIC_API_KEY"]
///
/// [roles.driver-by-hand]
/// backend = "mcp"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "backend", rename_all = "kebab-case")]
pub enum AgentConfig {
    /// An OpenAI-compatible chat-completions server.
    Openai(OpenAiConfig),
    /// Scripted replay from one or more files (entries for other roles are ignored).
    Script {
        /// Script files (`.json` or `.toml`), relative to the configuration's directory.
        #[serde(default)]
        path: Option<PathBuf>,
        /// More script files, joined with `path`.
        #[serde(default)]
        paths: Vec<PathBuf>,
    },
    /// An external program run in a scratch copy of the work tree.
    Command(CommandConfig),
    /// A coding client connected through `consort mcp` (the assignment waits in the
    /// feature's mailbox until a client takes and answers it).
    Mcp(McpConfig),
}

impl AgentConfig {
    /// Builds the agent for `role`. Relative script paths (and relative command paths with a
    /// slash) are resolved against `base_dir`.
    pub fn build(&self, role: Role, base_dir: &Path) -> Result<Arc<dyn Agent>, Error> {
        match self {
            AgentConfig::Openai(cfg) => Ok(Arc::new(OpenAiAgent::new(role, cfg.clone())?)),
            AgentConfig::Script { path, paths } => {
                let files: Vec<PathBuf> =
                    path.iter().chain(paths).map(|p| base_dir.join(p)).collect();
                if files.is_empty() {
                    return Err(Error::Config {
                        role,
                        detail: "a script backend needs `path` or `paths`".into(),
                    });
                }
                let script = Script::from_paths(&files)?;
                // The UX Designer is asked only when a story is user-facing: a script without
                // its entries is usual, and a run that asks halts naming the step.
                if !script.roles().contains(&role) && role != Role::UxDesigner {
                    tracing::warn!(%role, "the script has no entries for this role");
                }
                Ok(Arc::new(script.agent(role)))
            }
            AgentConfig::Command(cfg) => {
                if cfg.effective_program().trim().is_empty() {
                    return Err(Error::Config {
                        role,
                        detail: "a command backend needs `program` or `preset`".into(),
                    });
                }
                let mut cfg = cfg.clone();
                if cfg.program.contains('/') && Path::new(&cfg.program).is_relative() {
                    cfg.program = base_dir.join(&cfg.program).display().to_string();
                }
                Ok(Arc::new(ExternalCommandAgent::new(role, cfg)))
            }
            AgentConfig::Mcp(cfg) => {
                let Some(dir) = &cfg.mailbox else {
                    return Err(Error::Config {
                        role,
                        detail: "an mcp backend needs its project's mailbox directory".into(),
                    });
                };
                Ok(Arc::new(McpAgent::new(
                    Mailbox::new(base_dir.join(dir)),
                    cfg.transcript_dir.clone(),
                    cfg.max_refusals,
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_chosen_by_tag() {
        let text = r#"
            [driver]
            backend = "openai"
            base_url = "http://127.0.0.1:9/v1"
            model = "m"
            api_key_env = "CONSORT_TEST_UNSET_KEY_VAR"
            temperature = 0.5

            [navigator]
            backend = "command"
            program = "/bin/true"
            timeout_ms = 1000
        "#;
        let roles: std::collections::BTreeMap<String, AgentConfig> =
            toml::from_str(text).expect("parses");
        match &roles["driver"] {
            AgentConfig::Openai(c) => {
                assert_eq!(c.model, "m");
                assert_eq!(c.output_retries, 2);
                let err = AgentConfig::Openai(c.clone())
                    .build(Role::Driver, Path::new("."))
                    .expect_err("the key variable is unset");
                assert!(err.to_string().contains("CONSORT_TEST_UNSET_KEY_VAR"));
            }
            other => panic!("not openai: {other:?}"),
        }
        assert!(matches!(&roles["navigator"], AgentConfig::Command(c) if c.timeout_ms == 1000));
        let bad = toml::from_str::<AgentConfig>("backend = \"openai\"\nmodle = \"x\"");
        assert!(bad.is_err(), "unknown fields are refused");
    }
}
