//! The tools `consort mcp` offers: their names, descriptions and argument schemas, in one
//! table, and the argument types.

use rmcp::handler::server::tool::schema_for_type;
use rmcp::model::Tool;
use rmcp::schemars::{self, JsonSchema};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::ToolError;

/// No arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NoArgs {}

/// `log`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct LogArgs {
    /// Only the last N events (default: all).
    #[allow(dead_code)]
    pub last: Option<u64>,
}

/// `next_assignment`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NextArgs {
    /// The role to play: `navigator`, `driver`, … (one configured `backend = "mcp"`).
    pub role: String,
    /// Wait up to this many seconds for an assignment of that role (default 0, at most 300).
    #[serde(default)]
    pub wait_secs: u64,
}

/// `submit`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct SubmitArgs {
    /// The assignment id `next_assignment` gave.
    pub assignment: u64,
    /// The answer: `{"kind": "<answer_with>", "body": {…}}` following `answer_schema`.
    pub artifact: Value,
    /// Wait up to this many seconds for the run's verdict (default 120, at most 600).
    #[serde(default)]
    pub wait_secs: Option<u64>,
}

/// `approve`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct ApproveArgs {
    /// `design`, `deploy` or `promote`.
    #[schemars(with = "String")]
    pub gate: consort_actors::GateKind,
    /// The hash the gate waits for (64 hex digits, as `next` shows it).
    pub hash: String,
    /// A note recorded with the approval.
    #[serde(default)]
    pub note: Option<String>,
}

/// Every tool, `approve` only when offered.
pub(super) fn list(approve: bool) -> Vec<Tool> {
    let mut tools = vec![
        Tool::new(
            "status",
            "The feature's phase, step, test, pending gate, halt, last receipt and usage, as `consort status --json` prints them.",
            schema_for_type::<NoArgs>(),
        ),
        Tool::new(
            "next",
            "What waits next, with the exact command a person runs for it (an approval, a retry) or the tool a client calls.",
            schema_for_type::<NoArgs>(),
        ),
        Tool::new(
            "design",
            "The design bundle written at the design gate (stories, spec, schema, test list, UX), and whether it is frozen.",
            schema_for_type::<NoArgs>(),
        ),
        Tool::new(
            "log",
            "The ledger, one event per line, as `consort log` prints it.",
            schema_for_type::<LogArgs>(),
        ),
        Tool::new(
            "verify",
            "Checks the ledger chain, the frozen design, the frozen tests and the receipts, as `consort verify` does.",
            schema_for_type::<NoArgs>(),
        ),
        Tool::new(
            "branches",
            "Consort's database branches, as `consort branches` lists them.",
            schema_for_type::<NoArgs>(),
        ),
        Tool::new(
            "next_assignment",
            "Takes the assignment waiting for a role played through MCP: the step, its inputs and feedback, and the answer's kind and JSON schema. The author of a test's code is refused its review.",
            schema_for_type::<NextArgs>(),
        ),
        Tool::new(
            "submit",
            "Hands over the answer to an assignment taken with next_assignment and waits for the run's verdict: refused with the reason (submit again), or accepted and what the machine made of it.",
            schema_for_type::<SubmitArgs>(),
        ),
    ];
    if approve {
        tools.push(Tool::new(
            "approve",
            "Approves the gate waiting for the given hash, as this session's identity, recorded exactly as `consort approve` records it.",
            schema_for_type::<ApproveArgs>(),
        ));
    }
    tools
}

/// The arguments of `tool`, or a readable refusal.
pub(super) fn parse<T: DeserializeOwned>(
    tool: &str,
    args: serde_json::Map<String, Value>,
) -> Result<T, ToolError> {
    serde_json::from_value(Value::Object(args)).map_err(|e| ToolError::BadArguments {
        tool: tool.to_string(),
        detail: e.to_string(),
    })
}

/// An optional count argument.
pub(super) fn optional_count(tool: &str, v: &Value) -> Result<Option<usize>, ToolError> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_u64()
            .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
            .ok_or_else(|| ToolError::BadArguments {
                tool: tool.to_string(),
                detail: "`last` must be a whole number".into(),
            }),
    }
}
