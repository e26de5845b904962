//! A script skeleton people fill in: one entry per design step, every field of its artifact
//! shown with a placeholder, written from the same schemas as `docs/ARTIFACTS.md`.
//!
//! [`script_skeleton`] is what `consort init` writes; [`placeholders`] finds the fields of an
//! answer that still hold the skeleton's placeholder, so `consort doctor` can say a fresh
//! skeleton is not ready and a scripted agent refuses to answer with one.

use std::fmt::Write;

use consort_actors::{Artifact, Step};
use serde_json::{Map, Value};

use crate::openai::body_schema;

/// How every placeholder string of the skeleton begins. A string that begins with it is a
/// field nobody has filled in yet.
pub const PLACEHOLDER: &str = "FILL IN:";

/// The skeleton script `consort init` writes, in TOML: one entry per design step, each
/// artifact body with every field (required or not) and a placeholder value, and comments
/// with each field's meaning and where the full reference is.
pub fn script_skeleton() -> String {
    let mut out = String::from(
        "# Scripted agent answers: one [[entry]] per step. The fields of every artifact, with\n\
         # their meaning, are in docs/ARTIFACTS.md; the script format (step keys, attempts,\n\
         # patterns such as review/*/*) is in consort-agents/SCRIPTS.md.\n\
         #\n\
         # This skeleton has an entry for each design step. Replace every \"FILL IN: ...\" value\n\
         # (delete optional fields you do not need), then run `consort doctor`: it says which\n\
         # entries still hold placeholders and which steps have no entry yet. A run halts at the\n\
         # first step whose answer still holds one.\n\
         #\n\
         # The build lane needs, per test-list entry T<n>: red/T<n> (the Navigator's failing\n\
         # test), green/T<n> (the Driver's code), refactor/T<n>/0 and review/T<n>/0, each a\n\
         # change-set or review-verdict (see docs/ARTIFACTS.md). Patterns answer many steps:\n\
         #   [[entry]]\n\
         #   step = \"review/*/*\"\n\
         #   artifact = { kind = \"review-verdict\", body = { decision = \"approve\" } }\n",
    );
    for step in Step::design_lane() {
        write_entry(&mut out, &step);
    }
    out
}

fn write_entry(out: &mut String, step: &Step) {
    let kind = step.output_kind();
    let schema = body_schema(kind);
    let _ = write!(
        out,
        "\n# {step}: a `{kind}`, answered by the {} (docs/ARTIFACTS.md, section `{kind}`){}\n\
         [[entry]]\nstep = \"{step}\"\n[entry.artifact]\nkind = \"{kind}\"\n",
        step.role(),
        if *step == Step::Ux {
            "; asked only when a story is user-facing"
        } else {
            ""
        },
    );
    let skeleton = Skeleton { root: &schema };
    skeleton.table(out, "entry.artifact.body", &schema, false);
}

/// The schema a skeleton is written from, for resolving `$ref`s.
struct Skeleton<'a> {
    root: &'a Value,
}

/// One field of an object, as the skeleton writes it.
struct Field<'a> {
    name: &'a str,
    schema: &'a Value,
    required: bool,
}

impl<'a> Skeleton<'a> {
    /// Follows `$ref`, the non-null alternative of a nullable type, and the first variant of
    /// a union (the others are named in a comment by [`Skeleton::alternatives`]).
    fn resolve(&self, schema: &'a Value) -> &'a Value {
        if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            let name = r.rsplit('/').next().unwrap_or(r);
            if let Some(def) = self.root.get("$defs").and_then(|d| d.get(name)) {
                return self.resolve(def);
            }
        }
        let alts = schema
            .get("oneOf")
            .or_else(|| schema.get("anyOf"))
            .and_then(Value::as_array);
        if let Some(first) = alts.and_then(|a| {
            a.iter()
                .find(|v| v.get("type").and_then(Value::as_str) != Some("null"))
        }) {
            return self.resolve(first);
        }
        schema
    }

    /// For a tagged union, the tag's values and what each other variant has instead:
    /// `decision: approve (below), or revise with reasons`.
    fn alternatives(&self, schema: &Value) -> Option<String> {
        let schema = match schema.get("$ref").and_then(Value::as_str) {
            Some(r) => self.root.get("$defs")?.get(r.rsplit('/').next()?)?,
            None => schema,
        };
        let alts = schema
            .get("oneOf")
            .or_else(|| schema.get("anyOf"))?
            .as_array()?;
        let mut tag = None;
        let mut variants = Vec::new();
        for (i, v) in alts.iter().enumerate() {
            let props = v.get("properties").and_then(Value::as_object)?;
            let (name, value) = props.iter().find_map(|(n, p)| {
                let c = p
                    .get("const")
                    .or_else(|| p.get("enum").and_then(|e| e.get(0)))?;
                Some((n.as_str(), c.as_str()?))
            })?;
            tag = Some(name);
            let others: Vec<&str> = props
                .keys()
                .map(String::as_str)
                .filter(|k| *k != name)
                .collect();
            variants.push(match (i, others.is_empty()) {
                (0, _) => format!("{value} (below)"),
                (_, true) => value.to_string(),
                (_, false) => format!("{value} with {}", others.join(", ")),
            });
        }
        Some(format!("{}: {}", tag?, variants.join(", or ")))
    }

    fn fields(&self, object: &'a Value) -> Vec<Field<'a>> {
        let required: Vec<&str> = object
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        object
            .get("properties")
            .and_then(Value::as_object)
            .map(|props| {
                props
                    .iter()
                    .map(|(name, schema)| Field {
                        name,
                        schema,
                        required: required.contains(&name.as_str()),
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Writes the table `header` for an object schema: its plain fields as `key = value`, then
    /// its objects and arrays of objects as tables of their own.
    fn table(&self, out: &mut String, header: &str, schema: &'a Value, array_item: bool) {
        let _ = writeln!(
            out,
            "{}{header}{}",
            if array_item { "[[" } else { "[" },
            if array_item { "]]" } else { "]" }
        );
        if let Some(alts) = self.alternatives(schema) {
            let _ = writeln!(out, "# {alts} (see docs/ARTIFACTS.md)");
        }
        let object = self.resolve(schema);
        let fields = self.fields(object);
        let mut nested = Vec::new();
        for f in &fields {
            let resolved = self.resolve(f.schema);
            let item = resolved.get("items").map(|i| self.resolve(i));
            let is_object = |s: &Value| s.get("properties").is_some();
            if is_object(resolved) {
                nested.push((f, false));
            } else if item.is_some_and(is_object) {
                nested.push((f, true));
            } else {
                self.comment(out, f);
                let _ = writeln!(out, "{} = {}", f.name, self.value(f, resolved));
            }
        }
        for (f, array) in nested {
            self.comment(out, f);
            let target = if array {
                f.schema
                    .get("items")
                    .or_else(|| self.resolve(f.schema).get("items"))
                    .unwrap_or(f.schema)
            } else {
                f.schema
            };
            self.table(out, &format!("{header}.{}", f.name), target, array);
        }
    }

    fn comment(&self, out: &mut String, f: &Field<'_>) {
        let meaning = meaning(f.schema)
            .or_else(|| meaning(self.resolve(f.schema)))
            .unwrap_or_default();
        let optional = if f.required { "" } else { " (optional)" };
        if !meaning.is_empty() || !f.required {
            let _ = writeln!(out, "# {meaning}{optional}");
        }
    }

    /// A placeholder value in TOML for a field that is not a table.
    fn value(&self, f: &Field<'_>, schema: &Value) -> String {
        if let Some(c) = schema.get("const") {
            return toml_literal(c);
        }
        if let Some(first) = schema
            .get("enum")
            .and_then(Value::as_array)
            .and_then(|e| e.first())
        {
            return toml_literal(first);
        }
        match first_type(schema) {
            Some("boolean") => "false".into(),
            Some("integer") | Some("number") => "0".into(),
            Some("array") => {
                let item = schema.get("items").map(|i| self.resolve(i));
                let inner = Field {
                    name: f.name,
                    schema: item.unwrap_or(&Value::Null),
                    required: true,
                };
                format!("[{}]", self.value(&inner, item.unwrap_or(&Value::Null)))
            }
            Some("object") => "{}".into(),
            _ => toml_literal(&Value::String(format!(
                "{PLACEHOLDER} {}",
                f.name.replace('_', " ")
            ))),
        }
    }
}

fn first_type(schema: &Value) -> Option<&str> {
    match schema.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).find(|t| *t != "null"),
        _ => None,
    }
}

fn meaning(schema: &Value) -> Option<String> {
    let text = schema
        .get("description")
        .or_else(|| schema.get("title"))
        .and_then(Value::as_str)?;
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

fn toml_literal(value: &Value) -> String {
    match value {
        Value::String(s) => toml::Value::String(s.clone()).to_string(),
        other => other.to_string(),
    }
}

/// The fields of an answer that still hold the skeleton's placeholder, as paths such as
/// `body.stories[0].title`, in the artifact's field order. An error only if the artifact
/// cannot be written as JSON.
pub fn placeholders(artifact: &Artifact) -> Result<Vec<String>, serde_json::Error> {
    let value = serde_json::to_value(artifact)?;
    let mut found = Vec::new();
    if let Some(body) = value.get("body") {
        collect(body, "body".to_string(), &mut found);
    }
    Ok(found)
}

fn collect(value: &Value, path: String, found: &mut Vec<String>) {
    match value {
        Value::String(s) if s.starts_with(PLACEHOLDER) => found.push(path),
        Value::Array(items) => {
            for (i, v) in items.iter().enumerate() {
                collect(v, format!("{path}[{i}]"), found);
            }
        }
        Value::Object(map) => collect_object(map, &path, found),
        _ => {}
    }
}

fn collect_object(map: &Map<String, Value>, path: &str, found: &mut Vec<String>) {
    for (k, v) in map {
        collect(v, format!("{path}.{k}"), found);
    }
}

/// Field paths for people: the first five, then how many more (`body.a, body.b and 3 more`).
pub fn field_list(fields: &[String]) -> String {
    consort_actors::first_and_more(fields, 5)
}
