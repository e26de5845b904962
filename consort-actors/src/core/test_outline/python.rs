//! Python test files (pytest, unittest): a `test*` function is a test, a class holding test
//! methods is a group, an `autouse` fixture, a `setup_*`/`teardown_*` function, `pytestmark` or
//! module code that runs at import is a hook; each imported name is an item of its own.

use std::collections::BTreeSet;

use tree_sitter::Node;

use super::{Item, Kind, children, collect_identifiers, outside, test_uses, text_of};

pub(super) fn items(root: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    children(root)
        .into_iter()
        .flat_map(|n| item(n, src, uses))
        .collect()
}

/// Functions that pytest or unittest run around the tests of their level.
const HOOK_FUNCTIONS: &[&str] = &[
    "setup_module",
    "teardown_module",
    "setUpModule",
    "tearDownModule",
    "setup_function",
    "teardown_function",
    "setup_method",
    "teardown_method",
    "setup_class",
    "teardown_class",
    "setUp",
    "tearDown",
    "setUpClass",
    "tearDownClass",
    "asyncSetUp",
    "asyncTearDown",
    "setup",
    "teardown",
];

/// Where a test binds names of its own (so a module-level name of the same spelling does not
/// reach it).
const LOCAL_SITES: &[(&str, Option<&str>)] = &[
    ("assignment", Some("left")),
    ("augmented_assignment", Some("left")),
    ("for_statement", Some("left")),
    ("for_in_clause", Some("left")),
    ("named_expression", Some("name")),
    ("as_pattern_target", None),
    ("import_statement", None),
    ("import_from_statement", None),
    ("lambda_parameters", None),
];

fn item(node: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    let def = match node.kind() {
        "decorated_definition" => node.child_by_field_name("definition").unwrap_or(node),
        _ => node,
    };
    let name = def
        .child_by_field_name("name")
        .map(|n| text_of(n, src).to_string())
        .unwrap_or_default();
    match def.kind() {
        "function_definition" => vec![function(node, &name, src, uses)],
        "class_definition" => vec![class(node, def, name, src, uses)],
        "import_statement" | "import_from_statement" => imports(def, src),
        "future_import_statement" => vec![Item::code(Kind::Shared, node, src)],
        "expression_statement" => vec![statement(node, src)],
        _ => vec![Item::code(Kind::Hook, node, src)],
    }
}

fn function(node: Node<'_>, name: &str, src: &str, uses: &mut BTreeSet<String>) -> Item {
    let text = text_of(node, src);
    if name.starts_with("test") {
        // Its parameters are fixtures it asks for by name: uses, not locals.
        test_uses(
            node,
            src,
            (&["identifier"], Some(("attribute", "attribute"))),
            LOCAL_SITES,
            uses,
        );
        return Item::new(Kind::Test, name, text, node);
    }
    let decorators = decorators(node, src);
    let autouse = decorators
        .iter()
        .any(|d| d.contains("fixture") && d.replace(' ', "").contains("autouse=True"));
    let kind = if autouse || HOOK_FUNCTIONS.contains(&name) || name.starts_with("pytest_") {
        Kind::Hook
    } else {
        Kind::Shared
    };
    Item::code(kind, node, src).binding(vec![name.to_string()])
}

fn decorators(node: Node<'_>, src: &str) -> Vec<String> {
    children(node)
        .into_iter()
        .filter(|c| c.kind() == "decorator")
        .map(|c| text_of(c, src).to_string())
        .collect()
}

/// A class with test methods is a group; any other class a shared definition.
fn class(
    node: Node<'_>,
    def: Node<'_>,
    name: String,
    src: &str,
    uses: &mut BTreeSet<String>,
) -> Item {
    let Some(body) = def.child_by_field_name("body") else {
        return Item::code(Kind::Shared, node, src).binding(vec![name]);
    };
    let inner: Vec<Item> = children(body)
        .into_iter()
        .flat_map(|n| item(n, src, uses))
        .collect();
    if !inner
        .iter()
        .any(|i| matches!(i.kind, Kind::Test | Kind::Group))
    {
        return Item::code(Kind::Shared, node, src).binding(vec![name]);
    }
    let mut group = Item::new(Kind::Group, name.clone(), outside(node, body, src), node);
    group.children = inner;
    group.binds = vec![name];
    group
}

/// Each imported name is an item of its own, so an import may gain names and keep its own.
fn imports(node: Node<'_>, src: &str) -> Vec<Item> {
    let module = node
        .child_by_field_name("module_name")
        .map(|m| text_of(m, src));
    let mut cursor = node.walk();
    let names: Vec<Node<'_>> = node.children_by_field_name("name", &mut cursor).collect();
    if names.is_empty() {
        // `from m import *`: the names it brings are not known.
        return vec![Item::code(Kind::Shared, node, src)];
    }
    names
        .into_iter()
        .map(|n| {
            let (path, alias) = match n.kind() {
                "aliased_import" => (
                    n.child_by_field_name("name")
                        .map_or("", |p| text_of(p, src)),
                    n.child_by_field_name("alias").map(|a| text_of(a, src)),
                ),
                _ => (text_of(n, src), None),
            };
            let bound = alias.unwrap_or_else(|| match module {
                Some(_) => path,
                None => path.split('.').next().unwrap_or(path),
            });
            let text = match (module, alias) {
                (Some(m), Some(a)) => format!("from {m} import {path} as {a}"),
                (Some(m), None) => format!("from {m} import {path}"),
                (None, Some(a)) => format!("import {path} as {a}"),
                (None, None) => format!("import {path}"),
            };
            Item::new(Kind::Shared, text.clone(), text, node).binding(vec![bound.to_string()])
        })
        .collect()
}

/// An assignment defines names (`pytestmark` marks every test: a hook); a docstring is shared;
/// any other statement is code that runs when the module is imported.
fn statement(node: Node<'_>, src: &str) -> Item {
    let Some(expr) = children(node).into_iter().next() else {
        return Item::code(Kind::Shared, node, src);
    };
    match expr.kind() {
        "assignment" | "augmented_assignment" => {
            let mut names = BTreeSet::new();
            if let Some(left) = expr.child_by_field_name("left") {
                collect_identifiers(
                    left,
                    src,
                    &["identifier"],
                    Some(("attribute", "attribute")),
                    &mut names,
                );
            }
            let kind = if names.contains("pytestmark") {
                Kind::Hook
            } else {
                Kind::Shared
            };
            Item::code(kind, node, src).binding(names.into_iter().collect())
        }
        "string" | "concatenated_string" => Item::code(Kind::Shared, node, src),
        _ => Item::code(Kind::Hook, node, src),
    }
}
