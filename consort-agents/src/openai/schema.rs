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

#[cfg(test)]
mod tests {
    use super::*;

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
