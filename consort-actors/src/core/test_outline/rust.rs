//! Rust test files: a function with a test attribute (`#[test]`, `#[tokio::test]`, …) is a test,
//! a module holding tests is a group; an inner attribute (`#![…]`) applies to the whole file (a
//! hook). Attributes belong to the item they stand before.

use std::collections::BTreeSet;

use tree_sitter::Node;

use super::{Item, Kind, children, collect_identifiers, first_line as first, outside, text_of};

pub(super) fn items(root: Node<'_>, src: &str, uses: &mut BTreeSet<String>) -> Vec<Item> {
    let mut out = Vec::new();
    let mut attrs: Vec<Node<'_>> = Vec::new();
    for node in children(root) {
        if node.kind() == "attribute_item" {
            attrs.push(node);
            continue;
        }
        out.push(item(node, &attrs, src, uses));
        attrs.clear();
    }
    // Attributes before nothing still count: they stand in the file as written.
    out.extend(attrs.into_iter().map(|a| Item::code(Kind::Hook, a, src)));
    out
}

fn item(node: Node<'_>, attrs: &[Node<'_>], src: &str, uses: &mut BTreeSet<String>) -> Item {
    let start = attrs.first().copied().unwrap_or(node);
    let text = src.get(start.start_byte()..node.end_byte()).unwrap_or("");
    let name = node
        .child_by_field_name("name")
        .map(|n| text_of(n, src).to_string());
    let is_test = attrs.iter().any(|a| {
        let t = text_of(*a, src);
        t.contains("test") && !t.contains("cfg(test)")
    });
    match (node.kind(), name) {
        ("inner_attribute_item", _) => Item::new(Kind::Hook, first(text), text, start),
        ("function_item", Some(name)) if is_test => {
            collect_identifiers(node, src, &["identifier", "type_identifier"], None, uses);
            Item::new(Kind::Test, name, text, start)
        }
        ("mod_item", Some(name)) => match node.child_by_field_name("body") {
            Some(body) => {
                let inner = items(body, src, uses);
                if inner
                    .iter()
                    .any(|i| matches!(i.kind, Kind::Test | Kind::Group))
                {
                    let head = src.get(start.start_byte()..node.start_byte()).unwrap_or("");
                    let mut g = Item::new(
                        Kind::Group,
                        name.clone(),
                        format!("{head}{}", outside(node, body, src)),
                        start,
                    );
                    g.children = inner;
                    g.binds = vec![name];
                    g
                } else {
                    Item::new(Kind::Shared, first(text), text, start).binding(vec![name])
                }
            }
            None => Item::new(Kind::Shared, first(text), text, start).binding(vec![name]),
        },
        (_, name) => {
            Item::new(Kind::Shared, first(text), text, start).binding(name.into_iter().collect())
        }
    }
}
