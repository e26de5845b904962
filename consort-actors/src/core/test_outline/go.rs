//! Go test files: a `Test*`, `Benchmark*`, `Example*` or `Fuzz*` function is a test; `TestMain`
//! and `init` run around every test of the package (hooks), and so does an import for its side
//! effects (`_`) or into the file's scope (`.`); each imported package is an item of its own.

use std::collections::BTreeSet;

use tree_sitter::Node;

use super::{Item, Kind, children, collect_identifiers, text_of, unquote};

pub(super) fn items(root: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    children(root)
        .into_iter()
        .flat_map(|n| item(n, src, uses))
        .collect()
}

const TEST_PREFIXES: &[&str] = &["Test", "Benchmark", "Example", "Fuzz"];

fn item(node: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    let name = node
        .child_by_field_name("name")
        .map(|n| text_of(n, src).to_string());
    match (node.kind(), name) {
        ("import_declaration", _) => imports(node, src),
        ("function_declaration", Some(name)) if name == "TestMain" || name == "init" => {
            vec![Item::code(Kind::Hook, node, src).binding(vec![name])]
        }
        ("function_declaration", Some(name))
            if TEST_PREFIXES.iter().any(|p| name.starts_with(p)) =>
        {
            collect_identifiers(node, src, &["identifier", "type_identifier"], None, uses);
            vec![Item::new(Kind::Test, name, text_of(node, src), node)]
        }
        ("function_declaration", Some(name)) => {
            vec![Item::code(Kind::Shared, node, src).binding(vec![name])]
        }
        ("type_declaration" | "var_declaration" | "const_declaration", _) => {
            let mut names = BTreeSet::new();
            for spec in children(node) {
                let mut specs = vec![spec];
                if spec.kind().ends_with("_spec_list") {
                    specs = children(spec);
                }
                for s in specs {
                    let mut cursor = s.walk();
                    for n in s.children_by_field_name("name", &mut cursor) {
                        names.insert(text_of(n, src).to_string());
                    }
                }
            }
            vec![Item::code(Kind::Shared, node, src).binding(names.into_iter().collect())]
        }
        _ => vec![Item::code(Kind::Shared, node, src)],
    }
}

/// Each `import_spec` is an item of its own, so an import block may gain packages.
fn imports(node: Node<'_>, src: &str) -> Vec<Item> {
    let mut specs = Vec::new();
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        if n.kind() == "import_spec" {
            specs.push(n);
        } else {
            stack.extend(children(n));
        }
    }
    specs.sort_by_key(|s| s.start_byte());
    specs
        .into_iter()
        .map(|spec| {
            let path = spec
                .child_by_field_name("path")
                .map(|p| unquote(p, src))
                .unwrap_or_default();
            let alias = spec.child_by_field_name("name").map(|n| text_of(n, src));
            let bound = alias.unwrap_or_else(|| path.rsplit('/').next().unwrap_or(&path));
            let text = match alias {
                Some(a) => format!("import {a} \"{path}\""),
                None => format!("import \"{path}\""),
            };
            let kind = if matches!(alias, Some("_" | ".")) {
                Kind::Hook
            } else {
                Kind::Shared
            };
            let binds = match kind {
                Kind::Hook => Vec::new(),
                _ => vec![bound.to_string()],
            };
            Item::new(kind, text.clone(), text, spec).binding(binds)
        })
        .collect()
}
