//! The database objects a migration creates, alters or drops, read from its SQL: what tells
//! two lanes' migrations apart, or finds them on the same object.
//!
//! The reading is deliberately plain: a statement's leading `CREATE`, `ALTER` or `DROP` and the
//! name after its object keyword (and, for an index or a trigger, the table after `ON`).
//! Comments and quoted strings are skipped; names are compared without schema quotes and case.

use std::collections::BTreeSet;

/// The object kinds a statement names.
const KINDS: [&str; 9] = [
    "table",
    "view",
    "index",
    "function",
    "type",
    "sequence",
    "trigger",
    "schema",
    "procedure",
];

/// Words between a verb and its object kind, or between the kind and the name.
const SKIPPED: [&str; 10] = [
    "or",
    "replace",
    "unique",
    "temporary",
    "temp",
    "materialized",
    "if",
    "not",
    "exists",
    "only",
];

/// The objects `sql` creates, alters or drops, as `kind name` (`table stock`).
pub(crate) fn touched(sql: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for statement in statements(sql) {
        let words: Vec<String> = statement
            .split(|c: char| c.is_whitespace() || c == '(' || c == ';')
            .filter(|w| !w.is_empty())
            .map(str::to_ascii_lowercase)
            .collect();
        let Some(verb) = words.first() else { continue };
        if !matches!(verb.as_str(), "create" | "alter" | "drop") {
            continue;
        }
        let mut rest = words[1..]
            .iter()
            .skip_while(|w| SKIPPED.contains(&w.as_str()));
        let Some(kind) = rest.next().filter(|k| KINDS.contains(&k.as_str())) else {
            continue;
        };
        let mut rest = rest.skip_while(|w| SKIPPED.contains(&w.as_str()));
        if let Some(name) = rest.next() {
            out.insert(format!("{kind} {}", bare(name)));
        }
        if matches!(kind.as_str(), "index" | "trigger")
            && let Some(pos) = words.iter().position(|w| w == "on")
            && let Some(table) = words[pos + 1..]
                .iter()
                .find(|w| !SKIPPED.contains(&w.as_str()))
        {
            out.insert(format!("table {}", bare(table)));
        }
    }
    out
}

/// A name without its schema-qualifying quotes and a call's argument list.
fn bare(name: &str) -> String {
    name.split('(')
        .next()
        .unwrap_or(name)
        .replace('"', "")
        .trim_end_matches([',', ';'])
        .to_string()
}

/// The statements of `sql`, its comments and quoted text left out.
fn statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '-' if chars.peek() == Some(&'-') => {
                for c in chars.by_ref() {
                    if c == '\n' {
                        break;
                    }
                }
                current.push(' ');
            }
            '\'' => {
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                }
                current.push_str(" '' ");
            }
            '$' => {
                // A dollar-quoted body (`$$ … $$`, `$f$ … $f$`): its tag, then up to the same tag.
                let mut tag = String::from("$");
                while let Some(&n) = chars.peek() {
                    chars.next();
                    tag.push(n);
                    if n == '$' {
                        break;
                    }
                }
                let mut body = String::new();
                for c in chars.by_ref() {
                    body.push(c);
                    if body.ends_with(&tag) {
                        break;
                    }
                }
                current.push_str(" $$ ");
            }
            ';' => out.push(std::mem::take(&mut current)),
            c => current.push(c),
        }
    }
    out.push(current);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(items: &[&str]) -> BTreeSet<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn tables_indexes_and_functions_are_named() {
        let sql = "-- stock\nCREATE TABLE IF NOT EXISTS stock (sku text PRIMARY KEY);\n\
                   create unique index stock_sku on public.\"Orders\" (sku);\n\
                   ALTER TABLE ONLY stock ADD COLUMN reserved int;\n\
                   CREATE OR REPLACE FUNCTION level(s text) RETURNS int LANGUAGE sql AS $$ DROP TABLE x; $$;\n\
                   INSERT INTO stock VALUES ('create table nope');";
        assert_eq!(
            touched(sql),
            set(&[
                "function level",
                "index stock_sku",
                "table public.orders",
                "table stock",
            ])
        );
    }

    #[test]
    fn two_lanes_on_one_table_meet_and_on_two_tables_do_not() {
        let a = touched("CREATE TABLE stock (sku text);");
        let b = touched("ALTER TABLE stock ADD COLUMN pack int;");
        let c = touched("CREATE TABLE orders (id int);");
        assert!(!a.is_disjoint(&b));
        assert!(a.is_disjoint(&c));
    }
}
