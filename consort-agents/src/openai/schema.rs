//! The JSON schema a model is asked to follow: `{kind, body}` with the body's schema derived by
//! schemars from the artifact type.

use consort_actors::{
    ArchitectureVerdict, ArtifactKind, ChangeSet, ReviewVerdict, SchemaPlan, Spec, Stories,
    TestList, TestRunReceipt, UxDesign,
};
use serde_json::{Map, Value, json};

/// The schema of the body of an artifact kind, as schemars derives it.
pub fn body_schema(kind: ArtifactKind) -> Value {
    let schema = match kind {
        ArtifactKind::Stories => schemars::schema_for!(Stories),
        ArtifactKind::Spec => schemars::schema_for!(Spec),
        ArtifactKind::ArchitectureVerdict => schemars::schema_for!(ArchitectureVerdict),
        ArtifactKind::SchemaPlan => schemars::schema_for!(SchemaPlan),
        ArtifactKind::TestList => schemars::schema_for!(TestList),
        ArtifactKind::UxDesign => schemars::schema_for!(UxDesign),
        ArtifactKind::ChangeSet => schemars::schema_for!(ChangeSet),
        ArtifactKind::ReviewVerdict => schemars::schema_for!(ReviewVerdict),
        ArtifactKind::TestRunReceipt => schemars::schema_for!(TestRunReceipt),
    };
    schema.to_value()
}

/// The response schema for an artifact kind: an object `{kind, body}` whose `kind` is fixed.
///
/// The root is an object (OpenAI requires that; two bodies are enums). With `strict`, the
/// schema is rewritten for OpenAI's strict structured outputs: every object lists all its
/// properties as required and forbids others, optional properties become nullable (the parser
/// drops `null`s), `oneOf` becomes `anyOf`, `const` becomes a one-value `enum`, and the
/// `format`/`default` keywords are removed.
pub fn response_schema(kind: ArtifactKind, strict: bool) -> Value {
    let mut body = body_schema(kind);
    let defs = body
        .as_object_mut()
        .and_then(|o| {
            o.remove("$schema");
            o.remove("$defs")
        })
        .unwrap_or_else(|| Value::Object(Map::new()));
    let mut root = json!({
        "type": "object",
        "properties": {
            "kind": { "type": "string", "enum": [kind.to_string()] },
            "body": body,
        },
        "required": ["kind", "body"],
        "additionalProperties": false,
    });
    if defs.as_object().is_some_and(|d| !d.is_empty())
        && let Some(o) = root.as_object_mut()
    {
        o.insert("$defs".into(), defs);
    }
    if strict {
        make_strict(&mut root);
    }
    root
}

fn make_strict(v: &mut Value) {
    match v {
        Value::Object(o) => {
            o.remove("format");
            o.remove("default");
            if let Some(one_of) = o.remove("oneOf") {
                o.insert("anyOf".into(), one_of);
            }
            if let Some(c) = o.remove("const") {
                o.insert("enum".into(), Value::Array(vec![c]));
            }
            let props: Option<Vec<String>> = o
                .get("properties")
                .and_then(Value::as_object)
                .map(|p| p.keys().cloned().collect());
            if let Some(all) = props {
                let required: Vec<String> = o
                    .get("required")
                    .and_then(Value::as_array)
                    .map(|r| {
                        r.iter()
                            .filter_map(|x| x.as_str().map(str::to_string))
                            .collect()
                    })
                    .unwrap_or_default();
                if let Some(Value::Object(p)) = o.get_mut("properties") {
                    for (name, schema) in p.iter_mut() {
                        if !required.contains(name) {
                            make_nullable(schema);
                        }
                    }
                }
                o.insert(
                    "required".into(),
                    Value::Array(all.into_iter().map(Value::String).collect()),
                );
                o.insert("additionalProperties".into(), Value::Bool(false));
            }
            o.values_mut().for_each(make_strict);
        }
        Value::Array(items) => items.iter_mut().for_each(make_strict),
        _ => {}
    }
}

fn make_nullable(schema: &mut Value) {
    let Value::Object(o) = schema else { return };
    match o.get_mut("type") {
        Some(Value::String(t)) if t != "null" => {
            let t = t.clone();
            o.insert("type".into(), json!([t, "null"]));
        }
        Some(Value::Array(ts)) => {
            if !ts.iter().any(|t| t == "null") {
                ts.push(json!("null"));
            }
        }
        Some(_) => {}
        None => {
            let inner = std::mem::take(o);
            o.insert(
                "anyOf".into(),
                json!([Value::Object(inner), { "type": "null" }]),
            );
        }
    }
}

/// Property names in the order a model should write them: what a thing is (ids, names,
/// titles) first, then what it says, then its reasons, and a decision last — a model that
/// writes in schema order (as strict structured output does) reasons before it decides.
/// Names not listed come after these, alphabetically.
const REASONING_ORDER: [&str; 40] = [
    "kind",
    "id",
    "feature_id",
    "story_id",
    "ac_id",
    "version",
    "name",
    "title",
    "path",
    "op",
    "test_name",
    "as_a",
    "i_want",
    "so_that",
    "user_facing",
    "given",
    "when",
    "then",
    "summary",
    "description",
    "statement",
    "brief",
    "elements",
    "stories",
    "acceptance_criteria",
    "requirements",
    "invariants",
    "migrations",
    "sql",
    "entries",
    "screens",
    "changes",
    "content",
    "body",
    "out_of_scope",
    "open_questions",
    "rationale",
    "reasons",
    "notes",
    "decision",
];

fn rank(name: &str) -> (usize, &str) {
    let at = REASONING_ORDER.iter().position(|n| *n == name);
    (at.unwrap_or(REASONING_ORDER.len()), name)
}

/// The JSON text of a schema with every `properties` map (and its `required` list) in
/// `REASONING_ORDER`; everything else as `serde_json` writes it. The same value as `schema`
/// once parsed: only the order of the text differs.
pub fn ordered_schema_text(schema: &Value) -> String {
    let mut out = String::with_capacity(2048);
    write_ordered(schema, false, &mut out);
    out
}

fn write_ordered(v: &Value, is_properties: bool, out: &mut String) {
    match v {
        Value::Object(o) => {
            let mut keys: Vec<&String> = o.keys().collect();
            if is_properties {
                keys.sort_by_key(|k| rank(k));
            }
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                match (k.as_str(), &o[k]) {
                    ("required", Value::Array(names)) => {
                        let mut names: Vec<&Value> = names.iter().collect();
                        names.sort_by_key(|n| rank(n.as_str().unwrap_or_default()));
                        write_ordered(
                            &Value::Array(names.into_iter().cloned().collect()),
                            false,
                            out,
                        );
                    }
                    (key, value) => write_ordered(value, key == "properties", out),
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_ordered(item, false, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn properties_come_in_reasoning_order_and_the_schema_is_unchanged() {
        // The same schema, up to the order of the `required` lists.
        fn sort_required(v: &mut Value) {
            match v {
                Value::Object(o) => {
                    if let Some(Value::Array(r)) = o.get_mut("required") {
                        r.sort_by(|a, b| a.as_str().cmp(&b.as_str()));
                    }
                    o.values_mut().for_each(sort_required);
                }
                Value::Array(items) => items.iter_mut().for_each(sort_required),
                _ => {}
            }
        }
        for kind in ArtifactKind::ALL {
            let mut schema = response_schema(kind, true);
            let text = ordered_schema_text(&schema);
            let mut back: Value = serde_json::from_str(&text).expect("valid JSON");
            sort_required(&mut back);
            sort_required(&mut schema);
            assert_eq!(back, schema, "{kind}: the same schema");
        }
        let review = ordered_schema_text(&response_schema(ArtifactKind::ReviewVerdict, true));
        let (reasons, decision) = (review.find("\"reasons\":"), review.rfind("\"decision\":"));
        assert!(
            reasons < decision,
            "rationale before the decision: {review}"
        );
        let stories = ordered_schema_text(&response_schema(ArtifactKind::Stories, true));
        let at = |name: &str| {
            stories
                .find(&format!("\"{name}\":{{"))
                .unwrap_or(usize::MAX)
        };
        assert!(
            at("id") < at("title") && at("title") < at("acceptance_criteria"),
            "{stories}"
        );
        assert!(
            at("given") < at("when") && at("when") < at("then"),
            "{stories}"
        );
    }

    fn walk<'a>(v: &'a Value, out: &mut Vec<&'a Map<String, Value>>) {
        match v {
            Value::Object(o) => {
                out.push(o);
                o.values().for_each(|x| walk(x, out));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(x, out)),
            _ => {}
        }
    }

    #[test]
    fn strict_schemas_close_every_object() {
        for kind in [
            ArtifactKind::Stories,
            ArtifactKind::ArchitectureVerdict,
            ArtifactKind::SchemaPlan,
            ArtifactKind::TestList,
            ArtifactKind::ChangeSet,
            ArtifactKind::ReviewVerdict,
        ] {
            let s = response_schema(kind, true);
            assert_eq!(s["properties"]["kind"]["enum"][0], kind.to_string());
            let mut objs = Vec::new();
            walk(&s, &mut objs);
            for o in objs {
                assert!(!o.contains_key("oneOf"), "{kind}: oneOf left");
                assert!(!o.contains_key("format"), "{kind}: format left");
                if let Some(props) = o.get("properties").and_then(Value::as_object) {
                    assert_eq!(o["additionalProperties"], Value::Bool(false), "{kind}");
                    let req = o["required"].as_array().expect("required");
                    assert_eq!(req.len(), props.len(), "{kind}: all required");
                }
            }
        }
        // Optional fields become nullable: TestEntry.test_name.
        let s = response_schema(ArtifactKind::TestList, true);
        let entry = &s["$defs"]["TestEntry"]["properties"]["test_name"];
        assert!(entry.to_string().contains("null"), "{entry}");
    }
}
