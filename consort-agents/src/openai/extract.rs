//! Reading a chat-completion answer tolerantly, and finding the JSON in a model's text.

use serde_json::Value;

/// What one completion call returned, read from raw JSON.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Completion {
    /// The text of the first choice (or its first tool call's arguments).
    pub content: Option<String>,
    /// A refusal, when the model refused.
    pub refusal: Option<String>,
    /// Prompt tokens, when the server reported usage.
    pub prompt_tokens: Option<u64>,
    /// Completion tokens, when the server reported usage.
    pub completion_tokens: Option<u64>,
    /// Prompt tokens served from the server's prompt cache
    /// (`usage.prompt_tokens_details.cached_tokens`), when reported.
    pub cached_tokens: Option<u64>,
    /// The finish reason, when given.
    pub finish_reason: Option<String>,
    /// The function calls of the first choice, in order.
    pub tool_calls: Vec<ToolCall>,
}

/// One function call a model made.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolCall {
    /// The call's id, which its result must name (made up when the server gave none).
    pub id: String,
    /// The function.
    pub name: String,
    /// Its arguments, as the model wrote them (JSON text, unchecked).
    pub arguments: String,
}

fn tool_calls(message: &Value) -> Vec<ToolCall> {
    let Some(calls) = message.get("tool_calls").and_then(Value::as_array) else {
        return Vec::new();
    };
    calls
        .iter()
        .enumerate()
        .filter_map(|(i, c)| {
            let f = c.get("function")?;
            Some(ToolCall {
                id: c
                    .get("id")
                    .and_then(Value::as_str)
                    .map_or_else(|| format!("call_{i}"), str::to_string),
                name: f.get("name")?.as_str()?.to_string(),
                arguments: f
                    .get("arguments")
                    .and_then(Value::as_str)
                    .unwrap_or("{}")
                    .to_string(),
            })
        })
        .collect()
}

/// Reads a chat completion from raw JSON, tolerating what "compatible" servers omit or null:
/// `id`, `object`, `created`, `model`, `usage`, `index`, `role`. Only a first choice with a
/// message is required.
pub fn read_completion(v: &Value) -> Result<Completion, String> {
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| "the server's answer has no choices".to_string())?;
    let message = choice
        .get("message")
        .ok_or_else(|| "the server's first choice has no message".to_string())?;
    let mut content = match message.get("content") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(parts)) => {
            let text: Vec<&str> = parts
                .iter()
                .filter_map(|p| p.get("text").and_then(Value::as_str))
                .collect();
            (!text.is_empty()).then(|| text.concat())
        }
        _ => None,
    };
    if content.as_deref().is_none_or(|c| c.trim().is_empty()) {
        // Some servers implement structured output as a forced tool call.
        content = message
            .get("tool_calls")
            .and_then(Value::as_array)
            .and_then(|c| c.first())
            .and_then(|c| c.get("function"))
            .and_then(|f| f.get("arguments"))
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(content);
    }
    let usage = v.get("usage");
    let count = |name: &str| usage.and_then(|u| u.get(name)).and_then(Value::as_u64);
    Ok(Completion {
        content,
        refusal: message
            .get("refusal")
            .and_then(Value::as_str)
            .map(str::to_string),
        prompt_tokens: count("prompt_tokens"),
        completion_tokens: count("completion_tokens"),
        cached_tokens: usage
            .and_then(|u| u.get("prompt_tokens_details"))
            .and_then(|d| d.get("cached_tokens"))
            .and_then(Value::as_u64),
        finish_reason: choice
            .get("finish_reason")
            .and_then(Value::as_str)
            .map(str::to_string),
        tool_calls: tool_calls(message),
    })
}

/// Finds the JSON object in a model's text: the whole text, else a fenced block (```json
/// first), else the first balanced `{…}` that parses. `<think>…</think>` blocks are ignored.
pub fn extract_json(text: &str) -> Result<Value, String> {
    let text = strip_think(text.trim_start_matches('\u{feff}'));
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("the answer is empty".into());
    }
    let whole_err = match serde_json::from_str::<Value>(trimmed) {
        Ok(v) if v.is_object() => return Ok(v),
        Ok(_) => "the answer is JSON but not an object".to_string(),
        Err(e) => format!("the answer is not JSON ({e})"),
    };
    let mut fences = fenced_blocks(&text);
    // Blocks tagged json first, then the others, each group in order.
    fences.sort_by_key(|(tag, _)| !tag.eq_ignore_ascii_case("json"));
    for (_, block) in &fences {
        if let Ok(v) = serde_json::from_str::<Value>(block.trim())
            && v.is_object()
        {
            return Ok(v);
        }
    }
    for candidate in balanced_objects(&text) {
        if let Ok(v) = serde_json::from_str::<Value>(candidate) {
            return Ok(v);
        }
    }
    Err(format!(
        "{whole_err}, and no JSON object was found in it; answer with the JSON object only"
    ))
}

fn strip_think(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("<think>") {
        out.push_str(&rest[..start]);
        match rest[start..].find("</think>") {
            Some(end) => rest = &rest[start + end + "</think>".len()..],
            None => {
                rest = "";
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// ```tag\n…``` blocks: (tag, content).
fn fenced_blocks(text: &str) -> Vec<(String, &str)> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let Some(nl) = after.find('\n') else { break };
        let tag = after[..nl].trim().to_string();
        let body = &after[nl + 1..];
        let Some(close) = body.find("```") else { break };
        out.push((tag, &body[..close]));
        rest = &body[close + 3..];
    }
    out
}

/// Every balanced `{…}` substring, outermost first, skipping braces inside strings.
fn balanced_objects(text: &str) -> impl Iterator<Item = &str> {
    let bytes = text.as_bytes();
    let starts: Vec<usize> = bytes
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'{')
        .map(|(i, _)| i)
        // Bounded: each candidate is a linear scan.
        .take(64)
        .collect();
    starts.into_iter().filter_map(move |start| {
        let mut depth = 0usize;
        let mut in_str = false;
        let mut escaped = false;
        for (i, &b) in bytes.iter().enumerate().skip(start) {
            if in_str {
                match (escaped, b) {
                    (true, _) => escaped = false,
                    (false, b'\\') => escaped = true,
                    (false, b'"') => in_str = false,
                    _ => {}
                }
                continue;
            }
            match b {
                b'"' => in_str = true,
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        return text.get(start..=i);
                    }
                }
                _ => {}
            }
        }
        None
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_is_found_in_prose_fences_and_think_blocks() {
        assert_eq!(
            extract_json(r#" {"a": 1} "#).expect("plain"),
            json!({"a": 1})
        );
        let fenced = "Here you go:\n```json\n{\"a\": {\"b\": \"}\"}}\n```\nThanks";
        assert_eq!(
            extract_json(fenced).expect("fenced"),
            json!({"a": {"b": "}"}})
        );
        let prose = "<think>maybe {x}</think>The answer is {\"kind\": \"k\", \"body\": {}} ok";
        assert_eq!(
            extract_json(prose).expect("prose"),
            json!({"kind": "k", "body": {}})
        );
        let err = extract_json("I cannot do that").expect_err("none");
        assert!(err.contains("no JSON object"), "{err}");
        assert!(extract_json("   ").is_err());
    }

    #[test]
    fn completions_from_lax_servers_are_read() {
        let v = json!({
            "id": null,
            "choices": [{"message": {"content": "{}"}}]
        });
        let c = read_completion(&v).expect("lax");
        assert_eq!(c.content.as_deref(), Some("{}"));
        assert_eq!(c.prompt_tokens, None);
        let tool = json!({"choices": [{"message": {"content": null, "tool_calls": [
            {"function": {"name": "answer", "arguments": "{\"a\":1}"}}]}}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3}});
        let c = read_completion(&tool).expect("tool call");
        assert_eq!(c.content.as_deref(), Some("{\"a\":1}"));
        assert_eq!(c.completion_tokens, Some(3));
        assert!(read_completion(&json!({"choices": []})).is_err());
    }
}
