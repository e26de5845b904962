//! The tools `consort mcp` offers: their names, descriptions and argument schemas, in one
//! table, and the argument types.

use std::sync::Arc;

use rmcp::handler::server::tool::schema_for_type;
use rmcp::model::{JsonObject, Tool};
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
    #[serde(default)]
    pub last: Option<usize>,
}

/// `next_assignment`'s arguments.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct NextArgs {
    /// The role to play: `navigator`, `driver`, … (one configured `backend = "mcp"`).
    pub role: String,
    /// The feature to play it for (its id); by default any feature whose run waits for the
    /// role, every lane of `consort run --parallel N` included (the server's own with
    /// `--feature`).
    #[serde(default)]
    pub feature: Option<String>,
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
    /// The feature `next_assignment` gave with it (needed only when two features wait on
    /// assignments of the same id).
    #[serde(default)]
    pub feature: Option<String>,
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

/// Every tool as `name: what it does`, `approve` last.
const TOOLS: [&str; 9] = [
    "status: The feature's phase, step, test, pending gate, halt, last receipt and usage, as `consort status --json` prints them.",
    "next: What waits next, with the exact command a person runs for it (an approval, a retry) or the tool a client calls.",
    "design: The design bundle written at the design gate (stories, spec, schema, test list, UX), and whether it is frozen.",
    "log: The ledger, one event per line, as `consort log` prints it.",
    "verify: Checks the ledger chain, the frozen design, the frozen tests and the receipts, as `consort verify` does.",
    "branches: Consort's database branches, as `consort branches` lists them.",
    "next_assignment: Takes the assignment waiting for a role played through MCP, in any feature whose run waits for it (each lane of `consort run --parallel N`), or in the feature named: the feature, the step, its inputs and feedback, and the answer's kind and JSON schema. The author of a test's code is refused its review.",
    "submit: Hands over the answer to an assignment taken with next_assignment (give its feature too) and waits for the run's verdict: refused with the reason (submit again), or accepted and what the machine made of it, a halt included.",
    "approve: Approves the gate waiting for the given hash, as this session's identity, recorded exactly as `consort approve` records it.",
];

/// The schema of a tool's arguments.
fn schema(tool: &str) -> Arc<JsonObject> {
    match tool {
        "log" => schema_for_type::<LogArgs>(),
        "next_assignment" => schema_for_type::<NextArgs>(),
        "submit" => schema_for_type::<SubmitArgs>(),
        "approve" => schema_for_type::<ApproveArgs>(),
        _ => schema_for_type::<NoArgs>(),
    }
}

/// Every tool, `approve` only when offered.
pub(super) fn list(approve: bool) -> Vec<Tool> {
    TOOLS
        .iter()
        .filter_map(|tool| tool.split_once(": "))
        .filter(|(name, _)| approve || *name != "approve")
        .map(|(name, description)| Tool::new(name, description, schema(name)))
        .collect()
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approve_is_listed_only_when_offered() {
        let names =
            |approve| -> Vec<String> { list(approve).iter().map(|t| t.name.to_string()).collect() };
        let without = names(false);
        assert_eq!(
            without,
            [
                "status",
                "next",
                "design",
                "log",
                "verify",
                "branches",
                "next_assignment",
                "submit"
            ]
        );
        assert_eq!(names(true).last().map(String::as_str), Some("approve"));
    }

    #[test]
    fn arguments_are_checked_with_readable_refusals() {
        let args = |v: Value| v.as_object().cloned().unwrap_or_default();
        let err = parse::<SubmitArgs>("submit", args(serde_json::json!({"artifact": {}})))
            .expect_err("no assignment");
        assert_eq!(
            err.to_string(),
            "bad arguments for submit: missing field `assignment`"
        );
        let err = parse::<LogArgs>("log", args(serde_json::json!({"lats": 3})))
            .expect_err("unknown field");
        assert!(err.to_string().contains("unknown field `lats`"), "{err}");
        let ok = parse::<ApproveArgs>(
            "approve",
            args(serde_json::json!({"gate": "design", "hash": "ab"})),
        )
        .expect("parses");
        assert_eq!(ok.gate, consort_actors::GateKind::Design);
    }
}
