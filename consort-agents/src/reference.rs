//! A reference of every artifact's fields, written from the schemas the agents are held to.
//!
//! [`artifact_reference`] renders `docs/ARTIFACTS.md`: per artifact kind, its body's fields
//! (name, type, whether required, what it means) and those of every type it uses. It is made
//! from the same schemars schemas the OpenAI backend sends and the parser checks, so it cannot
//! drift from them; a test fails when the file in the repository is stale.

use std::fmt::Write;

use consort_actors::ArtifactKind;
use serde_json::Value;

use crate::openai::body_schema;

/// The whole reference, as Markdown.
pub fn artifact_reference() -> String {
    let mut out = String::from(
        "# Artifacts\n\n\
         Every artifact a role produces, field by field. An answer is an object `{kind, body}`; \
         `kind` is the name in each heading and `body` has the fields below. A scripted agent \
         writes the same objects in TOML (`[entry.artifact]` with `kind` and `[entry.artifact.body]`).\n\n\
         Generated from the schemas the agents are held to (`consort_agents::artifact_reference`); \
         `CONSORT_BLESS=1 cargo test -p consort-agents --test loopback -- reference::` rewrites it.\n",
    );
    for kind in ArtifactKind::ALL {
        let schema = body_schema(kind);
        let _ = write!(out, "\n## `{kind}`\n");
        if kind == ArtifactKind::TestRunReceipt {
            out.push_str(
                "\nWritten by Consort's verifier only; an agent that sends one is refused.\n",
            );
        }
        if let Some(text) = describe(&schema) {
            let _ = write!(out, "\n{text}\n");
        }
        write_fields(&mut out, &schema);
        write_variants(&mut out, &schema);
        let defs = schema.get("$defs").and_then(Value::as_object);
        for (name, def) in defs.into_iter().flatten() {
            let _ = write!(out, "\n### `{name}` (in `{kind}`)\n");
            if let Some(text) = describe(def) {
                let _ = write!(out, "\n{text}\n");
            }
            write_fields(&mut out, def);
            write_variants(&mut out, def);
        }
    }
    out
}

/// The table of an object's properties; nothing for a schema that is not an object.
fn write_fields(out: &mut String, schema: &Value) {
    let Some(props) = schema.get("properties").and_then(Value::as_object) else {
        return;
    };
    let required: Vec<&str> = schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    out.push_str("\n| field | type | required | meaning |\n|---|---|---|---|\n");
    for (name, prop) in props {
        let needed = if required.contains(&name.as_str()) {
            "yes"
        } else {
            "no"
        };
        let meaning = describe(prop).unwrap_or_default();
        let _ = writeln!(
            out,
            "| `{name}` | {} | {needed} | {} |",
            type_of(prop),
            cell(&meaning)
        );
    }
}

/// The alternatives of an enum or a tagged union, one line each.
fn write_variants(out: &mut String, schema: &Value) {
    let variants = schema
        .get("oneOf")
        .or_else(|| schema.get("anyOf"))
        .and_then(Value::as_array);
    let Some(variants) = variants else {
        if let Some(values) = schema.get("enum").and_then(Value::as_array) {
            let _ = writeln!(out, "\nOne of: {}.", literals(values));
        } else if schema.get("properties").is_none() {
            let _ = writeln!(out, "\nType: {}.", type_of(schema));
        }
        return;
    };
    out.push_str("\nOne of:\n\n");
    for v in variants {
        let meaning = describe(v).map(|d| format!(": {}", one_line(&d)));
        let _ = writeln!(
            out,
            "- {}{}",
            variant_name(v),
            meaning.as_deref().unwrap_or("")
        );
        if v.get("properties").is_some() {
            let mut fields = String::new();
            write_fields(&mut fields, v);
            for line in fields.lines().filter(|l| !l.is_empty()) {
                let _ = writeln!(out, "  {line}");
            }
        }
    }
}

/// How a variant is told apart: its constant, its values, or its tag field's value.
fn variant_name(v: &Value) -> String {
    if let Some(c) = v.get("const") {
        return literals(std::slice::from_ref(c));
    }
    if let Some(values) = v.get("enum").and_then(Value::as_array) {
        return literals(values);
    }
    let tag = v
        .get("properties")
        .and_then(Value::as_object)
        .and_then(|p| {
            p.iter().find_map(|(name, prop)| {
                let c = prop
                    .get("const")
                    .or_else(|| prop.get("enum").and_then(|e| e.get(0)))?;
                Some(format!("`{name}` = {}", literals(std::slice::from_ref(c))))
            })
        });
    tag.unwrap_or_else(|| type_of(v))
}

/// A schema's type in words: `string`, `array of Story`, `Priority or null`, ….
fn type_of(schema: &Value) -> String {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.rsplit('/').next().unwrap_or(r);
        return format!("`{name}`");
    }
    if let Some(alts) = schema
        .get("anyOf")
        .or_else(|| schema.get("oneOf"))
        .and_then(Value::as_array)
    {
        return alts.iter().map(type_of).collect::<Vec<_>>().join(" or ");
    }
    if let Some(values) = schema.get("enum").and_then(Value::as_array) {
        return literals(values);
    }
    if let Some(c) = schema.get("const") {
        return literals(std::slice::from_ref(c));
    }
    let types: Vec<String> = match schema.get("type") {
        Some(Value::String(t)) => vec![t.clone()],
        Some(Value::Array(ts)) => ts
            .iter()
            .filter_map(Value::as_str)
            .map(str::to_owned)
            .collect(),
        _ => Vec::new(),
    };
    let words: Vec<String> = types
        .iter()
        .map(|t| match t.as_str() {
            "array" => match schema.get("items") {
                Some(items) => format!("array of {}", type_of(items)),
                None => "array".into(),
            },
            "object"
                if schema
                    .get("additionalProperties")
                    .is_some_and(Value::is_object) =>
            {
                let values = schema.get("additionalProperties").map(type_of);
                format!("map to {}", values.unwrap_or_default())
            }
            other => other.to_owned(),
        })
        .collect();
    if words.is_empty() {
        "any".into()
    } else {
        words.join(" or ")
    }
}

fn describe(schema: &Value) -> Option<String> {
    let text = schema
        .get("description")
        .or_else(|| schema.get("title"))
        .and_then(Value::as_str)?;
    Some(text.trim().to_owned())
}

fn literals(values: &[Value]) -> String {
    values
        .iter()
        .map(|v| match v {
            Value::String(s) => format!("`{s}`"),
            other => format!("`{other}`"),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Text for one table cell: one line, pipes escaped.
fn cell(text: &str) -> String {
    one_line(text).replace('|', "\\|")
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Map;

    #[test]
    fn every_kind_has_a_section_and_every_body_field_a_row() {
        let text = artifact_reference();
        for kind in ArtifactKind::ALL {
            assert!(text.contains(&format!("\n## `{kind}`\n")), "{kind}");
            let schema = body_schema(kind);
            let props = schema.get("properties").and_then(Value::as_object);
            for name in props.map(Map::keys).into_iter().flatten() {
                assert!(text.contains(&format!("| `{name}` |")), "{kind}.{name}");
            }
        }
    }

    #[test]
    fn types_read_as_words() {
        let s = serde_json::json!({"type": "array", "items": {"$ref": "#/$defs/Story"}});
        assert_eq!(type_of(&s), "array of `Story`");
        let s = serde_json::json!({"type": ["string", "null"]});
        assert_eq!(type_of(&s), "string or null");
        let s = serde_json::json!({"anyOf": [{"$ref": "#/$defs/P"}, {"type": "null"}]});
        assert_eq!(type_of(&s), "`P` or null");
        assert_eq!(cell("a | b\n c"), "a \\| b c");
    }
}
