//! The conversation of one step: the assignment's opening messages, what followed, and how far
//! the prompt was cut to fit the model's context window.
//!
//! Fitting goes in [`Fit`] order, each level keeping everything the previous one kept less one
//! thing: first the step's code is listed (path and size) instead of carried, then only the
//! newest feedback is kept, then the results of tool rounds before the last one are cut, then
//! the last round's results are clipped to their first [`CLIPPED_RESULT`] characters. The
//! entry's test, the step and the schema plan are never cut.

use std::collections::BTreeMap;

use async_openai::types::chat::{
    ChatCompletionRequestMessage, ChatCompletionRequestToolMessageContent,
    ChatCompletionRequestUserMessage,
};
use consort_actors::{Assignment, Omission};
use serde_json::{Value, json};

/// How far a step's prompt was cut to fit the context window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Fit {
    /// Nothing cut.
    Whole,
    /// The step's code listed, not carried (the entry's test still is).
    CodeListed,
    /// Only the newest feedback kept.
    LatestFeedback,
    /// Tool results before the last round cut.
    EarlierResultsCut,
    /// The last round's results clipped too.
    LastResultsClipped,
}

impl std::fmt::Display for Fit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Fit::Whole => "nothing cut",
            Fit::CodeListed => "the code listed, not carried",
            Fit::LatestFeedback => "the code listed, only the newest feedback kept",
            Fit::EarlierResultsCut => {
                "the code listed, the newest feedback, earlier tool results cut"
            }
            Fit::LastResultsClipped => {
                "everything that can be cut cut, the last tool results clipped"
            }
        })
    }
}

impl Fit {
    fn tighter(self) -> Option<Fit> {
        match self {
            Fit::Whole => Some(Fit::CodeListed),
            Fit::CodeListed => Some(Fit::LatestFeedback),
            Fit::LatestFeedback => Some(Fit::EarlierResultsCut),
            Fit::EarlierResultsCut => Some(Fit::LastResultsClipped),
            Fit::LastResultsClipped => None,
        }
    }
}

const READ_IT: &str = "this step's code: read it with read_file";
const LEFT_OUT: &str = "left out to fit the model's context window";
const CUT_RESULT: &str = "(this result was cut to fit the model's context window)";
/// The characters of a tool result kept at [`Fit::LastResultsClipped`].
pub(super) const CLIPPED_RESULT: usize = 2_000;

/// One step's conversation.
pub(super) struct Talk<'a> {
    assignment: &'a Assignment,
    /// The model can read files (`read_file` is offered).
    can_read: bool,
    /// List the code for the model to read even when it fits.
    on_demand: bool,
    fit: Fit,
    opening: Vec<ChatCompletionRequestMessage>,
    later: Vec<ChatCompletionRequestMessage>,
}

impl<'a> Talk<'a> {
    pub(super) fn new(assignment: &'a Assignment, can_read: bool, on_demand: bool) -> Self {
        let list = (can_read && on_demand).then_some(READ_IT);
        Talk {
            assignment,
            can_read,
            on_demand,
            fit: Fit::Whole,
            opening: user_messages(assignment, list, false),
            later: Vec::new(),
        }
    }

    /// Every message after the system prompt, in order.
    pub(super) fn turns(&self) -> Vec<ChatCompletionRequestMessage> {
        self.opening.iter().chain(&self.later).cloned().collect()
    }

    pub(super) fn push(&mut self, message: impl Into<ChatCompletionRequestMessage>) {
        self.later.push(message.into());
    }

    pub(super) fn later_mut(&mut self) -> &mut Vec<ChatCompletionRequestMessage> {
        &mut self.later
    }

    pub(super) fn fit(&self) -> Fit {
        self.fit
    }

    /// Cuts the prompt one level further; `false` when nothing is left to cut.
    pub(super) fn tighten(&mut self) -> bool {
        let Some(next) = self.fit.tighter() else {
            return false;
        };
        self.fit = next;
        let list = if self.can_read && (self.on_demand || next >= Fit::CodeListed) {
            Some(READ_IT)
        } else {
            (next >= Fit::CodeListed).then_some(LEFT_OUT)
        };
        self.opening = user_messages(self.assignment, list, next >= Fit::LatestFeedback);
        if next >= Fit::EarlierResultsCut {
            cut_earlier_results(&mut self.later);
        }
        if next >= Fit::LastResultsClipped {
            clip_results(&mut self.later);
        }
        true
    }
}

/// Clips every tool result to its first [`CLIPPED_RESULT`] characters, saying so.
fn clip_results(later: &mut [ChatCompletionRequestMessage]) {
    for m in later {
        if let ChatCompletionRequestMessage::Tool(t) = m
            && let ChatCompletionRequestToolMessageContent::Text(text) = &t.content
            && text.chars().count() > CLIPPED_RESULT
        {
            let kept: String = text.chars().take(CLIPPED_RESULT).collect();
            t.content = ChatCompletionRequestToolMessageContent::Text(format!(
                "{kept}\n(the rest of this result was cut to fit the model's context window)"
            ));
        }
    }
}

/// Replaces the results of every tool round but the last with a note.
fn cut_earlier_results(later: &mut [ChatCompletionRequestMessage]) {
    let last_round = later.iter().rposition(
        |m| matches!(m, ChatCompletionRequestMessage::Assistant(a) if a.tool_calls.is_some()),
    );
    let Some(last_round) = last_round else {
        return;
    };
    for m in &mut later[..last_round] {
        if let ChatCompletionRequestMessage::Tool(t) = m {
            t.content = ChatCompletionRequestToolMessageContent::Text(CUT_RESULT.into());
        }
    }
}

/// The user messages of an assignment, as JSON: the part that stays the same from step to
/// step first (how the tests run, the schema plan), then the step's own part, so that a server
/// can cache the prompt's beginning (see `consort_actors::context`).
///
/// With `list` (a reason), the files other than the entry's test are listed with their sizes
/// under that reason instead of carried: the prompt stops growing with the code. With
/// `latest_feedback`, only the newest feedback entry is kept.
fn user_messages(
    a: &Assignment,
    list: Option<&'static str>,
    latest_feedback: bool,
) -> Vec<ChatCompletionRequestMessage> {
    let mut carried = a.inputs.clone();
    let entry_test = a.inputs.test.as_ref().map(|t| t.path.as_str());
    let listed: Vec<(String, usize)> = if list.is_some() {
        let (keep, read) = std::mem::take(&mut carried.files)
            .into_iter()
            .partition(|(p, _)| Some(p.as_str()) == entry_test);
        carried.files = keep;
        read.into_iter()
            .map(|(p, t): (String, String)| (p, t.len()))
            .collect()
    } else {
        Vec::new()
    };
    let mut inputs = serde_json::to_value(&carried).unwrap_or(Value::Null);
    let mut stable = serde_json::Map::new();
    if let Some(o) = inputs.as_object_mut() {
        o.retain(|_, v| !(v.is_null() || v.as_object().is_some_and(|m| m.is_empty())));
        if let Some(schema) = o.remove("schema") {
            stable.insert("schema".into(), schema);
        }
        if !a.inputs.not_included.is_empty() || a.inputs.not_listed.is_some() || !listed.is_empty()
        {
            o.remove("not_listed");
            o.insert(
                "not_included".into(),
                not_included(a, list.unwrap_or(READ_IT), &listed),
            );
        }
    }
    if let Some(h) = &a.runner {
        stable.insert("runner".into(), json!(h));
    }
    let feedback = match (latest_feedback, a.feedback.split_last()) {
        (true, Some((newest, older))) if !older.is_empty() => vec![
            format!(
                "({} earlier feedback entries cut to fit the model's context window)",
                older.len()
            ),
            newest.clone(),
        ],
        _ => a.feedback.clone(),
    };
    let mut step = json!({
        "step": a.step.to_string(),
        "role": a.role,
        "attempt": a.attempt,
        "answer_with": a.expected_kind(),
        "inputs": inputs,
        "feedback": feedback,
    });
    if let (Some(w), Some(o)) = (&a.writes, step.as_object_mut()) {
        o.insert("writes".into(), json!(w));
    }
    let mut out = Vec::with_capacity(2);
    if !stable.is_empty() {
        out.push(ChatCompletionRequestUserMessage::from(Value::Object(stable).to_string()).into());
    }
    out.push(ChatCompletionRequestUserMessage::from(step.to_string()).into());
    out
}

/// The files an assignment lists but does not carry, grouped by why: `{"not in this step's
/// context": ["tests/t1.sql (638 bytes)", …]}`; `listed` are the step's own files, listed
/// under `why_listed`.
fn not_included(a: &Assignment, why_listed: &str, listed: &[(String, usize)]) -> Value {
    let mut groups: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (path, bytes) in listed {
        groups
            .entry(why_listed)
            .or_default()
            .push(format!("{path} ({bytes} bytes)"));
    }
    for f in &a.inputs.not_included {
        let why = match f.why {
            Omission::NotInPack => "not in this step's context",
            Omission::OverLimit => "over the assignment's size limit",
            Omission::NotText => "not text",
        };
        groups
            .entry(why)
            .or_default()
            .push(format!("{} ({} bytes)", f.path, f.bytes));
    }
    if let Some(rest) = a.inputs.not_listed {
        groups
            .entry("not listed")
            .or_default()
            .push(format!("{} more files ({} bytes)", rest.files, rest.bytes));
    }
    json!(groups)
}

#[cfg(test)]
mod tests {
    use async_openai::types::chat::{
        ChatCompletionMessageToolCall, ChatCompletionMessageToolCalls,
        ChatCompletionRequestAssistantMessage, ChatCompletionRequestToolMessage, FunctionCall,
    };

    use super::*;

    fn round(talk: &mut Talk<'_>, id: &str, result: &str) {
        talk.push(ChatCompletionRequestAssistantMessage {
            tool_calls: Some(vec![ChatCompletionMessageToolCalls::Function(
                ChatCompletionMessageToolCall {
                    id: id.into(),
                    function: FunctionCall {
                        name: "read_file".into(),
                        arguments: "{}".into(),
                    },
                },
            )]),
            ..ChatCompletionRequestAssistantMessage::default()
        });
        talk.push(ChatCompletionRequestToolMessage {
            content: ChatCompletionRequestToolMessageContent::Text(result.into()),
            tool_call_id: id.into(),
        });
    }

    fn text(talk: &Talk<'_>) -> String {
        serde_json::to_string(&talk.turns()).expect("JSON")
    }

    #[test]
    fn each_fit_level_cuts_one_more_thing_and_never_the_entry_or_the_step() {
        let mut a = consort_testkit::artifacts::with_files(
            consort_testkit::artifacts::assignment(1, "green/T1"),
            &[
                ("src/code.sql", "CODE-BODY"),
                ("tests/t1.sql", "ENTRY-TEST"),
            ],
        );
        a.inputs.test = Some(consort_actors::TestEntry {
            description: "d".into(),
            ..consort_testkit::artifacts::entry("T1", "S1-AC1", "tests/t1.sql")
        });
        a.feedback = vec!["OLD-FEEDBACK".into(), "NEW-FEEDBACK".into()];
        let mut talk = Talk::new(&a, false, true);
        round(&mut talk, "c1", "FIRST-RESULT");
        round(&mut talk, "c2", &"X".repeat(CLIPPED_RESULT + 10));
        let whole = text(&talk);
        assert!(whole.contains("CODE-BODY") && whole.contains("OLD-FEEDBACK"));

        assert!(talk.tighten());
        let listed = text(&talk);
        assert!(
            !listed.contains("CODE-BODY"),
            "the code is listed, not carried"
        );
        assert!(listed.contains("src/code.sql (9 bytes)") && listed.contains(LEFT_OUT));
        assert!(listed.contains("OLD-FEEDBACK"));

        assert!(talk.tighten());
        let latest = text(&talk);
        assert!(!latest.contains("OLD-FEEDBACK") && latest.contains("NEW-FEEDBACK"));
        assert!(latest.contains("1 earlier feedback entries cut"));
        assert!(latest.contains("FIRST-RESULT"));

        assert!(talk.tighten());
        let earlier = text(&talk);
        assert!(
            !earlier.contains("FIRST-RESULT"),
            "the earlier round's result is cut"
        );
        assert!(
            earlier.contains(&"X".repeat(CLIPPED_RESULT + 10)),
            "the last is whole"
        );

        assert!(talk.tighten());
        let clipped = text(&talk);
        assert!(!clipped.contains(&"X".repeat(CLIPPED_RESULT + 1)));
        assert!(clipped.contains("the rest of this result was cut"));

        assert!(!talk.tighten(), "nothing is left to cut");
        assert_eq!(talk.fit(), Fit::LastResultsClipped);
        for kept in ["ENTRY-TEST", "green/T1", "NEW-FEEDBACK"] {
            assert!(text(&talk).contains(kept), "{kept} is never cut");
        }
    }
}
