//! JavaScript and TypeScript test files (jest, vitest, mocha, node's runner): a `test(…)` or
//! `it(…)` call is a test, a `describe(…)` call a group read item by item, a `beforeEach`-like
//! call, a `jest.*`/`vi.*` call (a module mock), a side-effect import or any other statement that
//! runs when the file loads is a hook; each imported name is an item of its own.

use std::collections::BTreeSet;

use tree_sitter::Node;

use super::{Item, Kind, children, collect_identifiers, outside, test_uses, text_of, unquote};

pub(super) fn items(root: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    children(root)
        .into_iter()
        .flat_map(|n| item(n, src, uses))
        .collect()
}

const TESTS: &[&str] = &["test", "it", "xit", "xtest", "fit", "specify"];
const GROUPS: &[&str] = &["describe", "context", "suite", "xdescribe", "fdescribe"];
/// What the identifiers of a test are, as the shadowing check sees them.
const IDENTIFIERS: &[&str] = &["identifier", "shorthand_property_identifier"];

/// Where a test binds names of its own.
const LOCAL_SITES: &[(&str, Option<&str>)] = &[
    ("variable_declarator", Some("name")),
    ("formal_parameters", None),
    ("catch_clause", Some("parameter")),
    ("for_in_statement", Some("left")),
];

fn item(node: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    match node.kind() {
        "expression_statement" => {
            let expr = children(node).into_iter().next();
            match expr.filter(|e| e.kind() == "call_expression") {
                Some(call) => vec![call_item(node, call, src, uses)],
                None => vec![Item::code(Kind::Hook, node, src)],
            }
        }
        "import_statement" => imports(node, src),
        "lexical_declaration" | "variable_declaration" => {
            if let Some(items) = required_names(node, src) {
                return items;
            }
            let mut names = BTreeSet::new();
            for d in children(node)
                .into_iter()
                .filter(|d| d.kind() == "variable_declarator")
            {
                if let Some(name) = d.child_by_field_name("name") {
                    collect_identifiers(
                        name,
                        src,
                        &["identifier", "shorthand_property_identifier_pattern"],
                        None,
                        &mut names,
                    );
                }
            }
            vec![Item::code(Kind::Shared, node, src).binding(names.into_iter().collect())]
        }
        "export_statement" => match node.child_by_field_name("declaration") {
            Some(decl) => item(decl, src, uses)
                .into_iter()
                .map(|mut i| {
                    i.text = text_of(node, src).to_string();
                    i
                })
                .collect(),
            None => vec![Item::code(Kind::Shared, node, src)],
        },
        "hash_bang_line" | "empty_statement" => vec![Item::code(Kind::Shared, node, src)],
        kind if kind.ends_with("declaration") => {
            let name = node
                .child_by_field_name("name")
                .map(|n| vec![text_of(n, src).to_string()])
                .unwrap_or_default();
            vec![Item::code(Kind::Shared, node, src).binding(name)]
        }
        _ => vec![Item::code(Kind::Hook, node, src)],
    }
}

/// `const { a, b: c } = require('x')`: each name taken from the module is an item of its own,
/// like an import's, so the declaration may gain names and keep its own.
fn required_names(node: Node<'_>, src: &str) -> Option<Vec<Item>> {
    let [declarator] = children(node)[..] else {
        return None;
    };
    let pattern = declarator
        .child_by_field_name("name")
        .filter(|p| p.kind() == "object_pattern")?;
    let value = declarator
        .child_by_field_name("value")
        .filter(|v| v.kind() == "call_expression")?;
    let callee = value.child_by_field_name("function")?;
    if text_of(callee, src) != "require" {
        return None;
    }
    let module = text_of(value.child_by_field_name("arguments")?, src);
    let keyword = node.child(0).map_or("const", |k| text_of(k, src));
    children(pattern)
        .into_iter()
        .map(|p| {
            let bound = match p.kind() {
                "shorthand_property_identifier_pattern" => text_of(p, src),
                "pair_pattern" => p.child_by_field_name("value").map(|v| text_of(v, src))?,
                _ => return None,
            };
            let text = format!("{keyword} {{ {} }} = require{module}", text_of(p, src));
            Some(Item::new(Kind::Shared, text.clone(), text, node).binding(vec![bound.into()]))
        })
        .collect()
}

/// The identifier a callee starts from: `test` of `test.each([…])`, `describe` of
/// `describe.skip`.
fn root_of<'s>(mut callee: Node<'_>, src: &'s str) -> &'s str {
    loop {
        let next = match callee.kind() {
            "member_expression" => callee.child_by_field_name("object"),
            "call_expression" => callee.child_by_field_name("function"),
            "identifier" => return text_of(callee, src),
            _ => None,
        };
        match next {
            Some(n) => callee = n,
            None => return "",
        }
    }
}

fn call_item(stmt: Node<'_>, call: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Item {
    let Some(callee) = call.child_by_field_name("function") else {
        return Item::code(Kind::Hook, stmt, src);
    };
    let root = root_of(callee, src);
    let args = call
        .child_by_field_name("arguments")
        .map(children)
        .unwrap_or_default();
    let title = args.first().map(|a| unquote(*a, src)).unwrap_or_default();
    let callee_text = text_of(callee, src);
    let exclusive = callee_text.contains(".only") || root == "fit" || root == "fdescribe";
    let mut item = if TESTS.contains(&root) {
        test_uses(stmt, src, (IDENTIFIERS, None), LOCAL_SITES, uses);
        Item::new(Kind::Test, title, text_of(stmt, src), stmt)
    } else if GROUPS.contains(&root) {
        group(stmt, &args, title, src, uses)
    } else {
        Item::code(Kind::Hook, stmt, src)
    };
    item.exclusive = exclusive;
    item
}

/// A `describe` block: its header is all but the body of its callback, its items are read from
/// that body.
fn group(
    stmt: Node<'_>,
    args: &[Node<'_>],
    title: String,
    src: &str,
    uses: &mut BTreeSet<String>,
) -> Item {
    let body = args
        .iter()
        .rev()
        .find(|a| {
            matches!(
                a.kind(),
                "arrow_function" | "function_expression" | "function"
            )
        })
        .and_then(|f| f.child_by_field_name("body"))
        .filter(|b| b.kind() == "statement_block");
    let Some(body) = body else {
        return Item::code(Kind::Hook, stmt, src);
    };
    let mut g = Item::new(Kind::Group, title, outside(stmt, body, src), stmt);
    g.children = children(body)
        .into_iter()
        .flat_map(|n| item(n, src, uses))
        .collect();
    g
}

/// Each imported name is an item of its own; an import of nothing (for its side effects) is a
/// hook.
fn imports(node: Node<'_>, src: &str) -> Vec<Item> {
    let source = node
        .child_by_field_name("source")
        .map_or_else(String::new, |s| text_of(s, src).to_string());
    let prefix = if text_of(node, src).starts_with("import type") {
        "import type"
    } else {
        "import"
    };
    let Some(clause) = children(node)
        .into_iter()
        .find(|c| c.kind() == "import_clause")
    else {
        return vec![Item::code(Kind::Hook, node, src)];
    };
    let mut out = Vec::new();
    let mut add = |what: String, bound: &str| {
        let text = format!("{prefix} {what} from {source}");
        out.push(
            Item::new(Kind::Shared, text.clone(), text, node).binding(vec![bound.to_string()]),
        );
    };
    for part in children(clause) {
        match part.kind() {
            "identifier" => add(
                format!("default as {}", text_of(part, src)),
                text_of(part, src),
            ),
            "namespace_import" => {
                let name = children(part).first().map_or("", |n| text_of(*n, src));
                add(format!("* as {name}"), name);
            }
            "named_imports" => {
                for spec in children(part)
                    .into_iter()
                    .filter(|s| s.kind() == "import_specifier")
                {
                    let name = spec
                        .child_by_field_name("name")
                        .map_or("", |n| text_of(n, src));
                    let alias = spec.child_by_field_name("alias").map(|a| text_of(a, src));
                    add(
                        format!("{{ {name} as {} }}", alias.unwrap_or(name)),
                        alias.unwrap_or(name),
                    );
                }
            }
            _ => {}
        }
    }
    out
}
