//! What is frozen of a test file that holds accepted tests: each test's own definition, and what
//! the file's tests share — judged on the syntax tree of a real parser (tree-sitter's grammars),
//! so that a later RED may add tests to a file while every accepted test stays as accepted.
//!
//! A file is read into an outline: its top-level items, each one of
//!
//! | kind | what | examples |
//! |---|---|---|
//! | test | one test's definition, with its decorators, marks and attributes | `def test_x`, `test('…', …)`, `func TestX`, `#[test] fn x` |
//! | group | a block of tests with a header of its own, read item by item | `class TestX:`, `describe('…', …)`, `mod tests { … }` |
//! | hook | code that applies to every test of its level | an `autouse` fixture, `beforeEach`, `jest.mock`, `TestMain`, `init`, module code |
//! | shared | what tests may use: one imported name, a fixture, a helper, a constant | `from x import a`, `const app = …`, `func helper` |
//!
//! [`judge`] compares the file as frozen with the file a RED writes. Every item of the frozen
//! file must still be there with exactly its text (an item may move; it may not change); a
//! group is compared by its header and then item by item. Added items are free inside a new
//! group (its hooks cover only its tests); at a level that holds frozen tests a new test or a
//! new shared item is allowed, but not a new hook, a test marked to run alone (`.only`), nor a
//! definition of a name the frozen file already defines or its tests use (it would change what
//! they run). A file the parser cannot read cleanly is refused: what cannot be told apart stays
//! frozen whole.
//!
//! This is the one place where a test file is taken apart; the machine gets its verdicts as
//! data ([`crate::Machine::check_resolved`]) and refuses a RED whose verdict is missing.

mod go;
mod javascript;
mod python;
mod rust;

use std::collections::BTreeSet;

use tree_sitter::{Node, Parser, Tree};

/// A language whose test files are parsed, so that a test is frozen and not its file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    /// Python (`.py`): pytest and unittest test files.
    Python,
    /// JavaScript (`.js`, `.jsx`, `.mjs`, `.cjs`): jest, vitest, mocha, node's runner.
    JavaScript,
    /// TypeScript (`.ts`, `.mts`, `.cts`).
    TypeScript,
    /// TypeScript with JSX (`.tsx`).
    Tsx,
    /// Go (`_test.go` and any `.go` file).
    Go,
    /// Rust (`.rs`).
    Rust,
}

impl Language {
    /// The language of a test file, by its extension; None: not parsed, frozen whole.
    pub fn of(path: &str) -> Option<Language> {
        let ext = path.rsplit_once('.').map(|(_, e)| e)?;
        Some(match ext {
            "py" => Language::Python,
            "js" | "jsx" | "mjs" | "cjs" => Language::JavaScript,
            "ts" | "mts" | "cts" => Language::TypeScript,
            "tsx" => Language::Tsx,
            "go" => Language::Go,
            "rs" => Language::Rust,
            _ => return None,
        })
    }

    /// The language's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "Python",
            Language::JavaScript => "JavaScript",
            Language::TypeScript => "TypeScript",
            Language::Tsx => "TSX",
            Language::Go => "Go",
            Language::Rust => "Rust",
        }
    }

    fn grammar(self) -> tree_sitter::Language {
        match self {
            Language::Python => tree_sitter_python::LANGUAGE.into(),
            Language::JavaScript => tree_sitter_javascript::LANGUAGE.into(),
            Language::TypeScript => tree_sitter_typescript::LANGUAGE_TYPESCRIPT.into(),
            Language::Tsx => tree_sitter_typescript::LANGUAGE_TSX.into(),
            Language::Go => tree_sitter_go::LANGUAGE.into(),
            Language::Rust => tree_sitter_rust::LANGUAGE.into(),
        }
    }
}

/// The languages parsed, for people: what the README and the refusals name.
pub const PARSED_LANGUAGES: &str = "Python, JavaScript, TypeScript, Go and Rust";

/// Why a RED's new version of a file that holds frozen tests is refused: a sentence for the
/// agent, naming the item and its line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct FrozenChange(pub String);

/// The conductor's judgement of each file holding frozen tests that a RED writes, by path: what
/// [`crate::core::machine::Machine::check_resolved`] requires before the write is applied.
pub type TestFileVerdicts = std::collections::BTreeMap<String, Result<(), FrozenChange>>;

/// Judges `new`, a RED's version of the test file `path` whose frozen version is `old`: every
/// item of `old` must stand in `new` as it was, and what `new` adds must not reach the frozen
/// tests (see the module documentation). `open` names a test the RED may write again (a
/// person's redo of the entry's test, by the name the runner reports): its definition is not
/// frozen, everything else is.
pub fn judge(path: &str, old: &str, new: &str, open: Option<&str>) -> Result<(), FrozenChange> {
    let Some(language) = Language::of(path) else {
        return Err(FrozenChange(format!(
            "{path} is in a language Consort does not parse ({PARSED_LANGUAGES} are), so it is frozen whole"
        )));
    };
    let old = Outline::read(language, old).map_err(|why| {
        FrozenChange(format!(
            "the frozen version of {path} does not parse ({why}), so its tests cannot be told apart and it stays frozen whole"
        ))
    })?;
    let new = Outline::read(language, new)
        .map_err(|why| FrozenChange(format!("the new version of {path} does not parse: {why}")))?;
    let open = open.and_then(|name| old.test_named(name));
    let context = Context {
        top: old
            .items
            .iter()
            .flat_map(|i| i.binds.iter().cloned())
            .collect(),
        used: old.uses.clone(),
        open,
    };
    compare_level(&context, &old.items, &new.items, &mut Vec::new())
}

/// One item of a test file's outline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Item {
    kind: Kind,
    /// A test's or group's name (unquoted); for other items, their first line.
    key: String,
    /// The item's whole text (a group: its text outside its body).
    text: String,
    /// The names it defines at its level.
    binds: Vec<String>,
    /// Its first line, 1-based.
    line: usize,
    /// A group's items.
    children: Vec<Item>,
    /// A test or group that runs alone and so skips the others (`.only`, `fit`).
    exclusive: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    Test,
    Group,
    Hook,
    Shared,
}

impl Item {
    fn new(kind: Kind, key: impl Into<String>, text: impl Into<String>, node: Node<'_>) -> Item {
        Item {
            kind,
            key: key.into(),
            text: text.into(),
            binds: Vec::new(),
            line: node.start_position().row + 1,
            children: Vec::new(),
            exclusive: false,
        }
    }

    fn binding(mut self, names: Vec<String>) -> Item {
        self.binds = names;
        self
    }

    /// A shared or hook item of `node`'s text, keyed by its first line.
    fn code(kind: Kind, node: Node<'_>, src: &str) -> Item {
        let text = text_of(node, src);
        Item::new(kind, first_line(text), text, node)
    }

    fn describe(&self) -> String {
        match self.kind {
            Kind::Test => format!("test `{}` (line {})", self.key, self.line),
            Kind::Group => format!("group `{}` (line {})", self.key, self.line),
            Kind::Hook | Kind::Shared => format!("`{}` (line {})", self.key, self.line),
        }
    }
}

/// A parsed test file: its items, and the identifiers its tests use.
#[derive(Debug)]
struct Outline {
    items: Vec<Item>,
    uses: BTreeSet<String>,
}

impl Outline {
    fn read(language: Language, src: &str) -> Result<Outline, String> {
        let tree = parse(language, src)?;
        let root = tree.root_node();
        let mut uses = BTreeSet::new();
        let items = match language {
            Language::Python => python::items(root, src, &mut uses),
            Language::JavaScript | Language::TypeScript | Language::Tsx => {
                javascript::items(root, src, &mut uses)
            }
            Language::Go => go::items(root, src, &mut uses),
            Language::Rust => rust::items(root, src, &mut uses),
        };
        Ok(Outline { items, uses })
    }

    /// The test the runner reports as `name`, by its key path: the whole qualified name
    /// first, else the longest key the name ends with.
    fn test_named(&self, name: &str) -> Option<Vec<String>> {
        let mut found: Vec<Vec<String>> = Vec::new();
        fn walk(items: &[Item], path: &mut Vec<String>, out: &mut Vec<Vec<String>>) {
            for i in items {
                path.push(i.key.clone());
                match i.kind {
                    Kind::Test => out.push(path.clone()),
                    Kind::Group => walk(&i.children, path, out),
                    _ => {}
                }
                path.pop();
            }
        }
        walk(&self.items, &mut Vec::new(), &mut found);
        let tail = name.rsplit("::").next().unwrap_or(name);
        let tail = tail.split('/').next().unwrap_or(tail);
        found
            .iter()
            .find(|p| p.join(" ") == tail || p.join(".") == tail)
            .or_else(|| {
                found
                    .iter()
                    .filter(|p| p.last().is_some_and(|k| tail.ends_with(k.as_str())))
                    .max_by_key(|p| p.last().map_or(0, String::len))
            })
            .cloned()
    }
}

fn parse(language: Language, src: &str) -> Result<Tree, String> {
    let mut parser = Parser::new();
    parser
        .set_language(&language.grammar())
        .map_err(|e| format!("the {} grammar could not be loaded: {e}", language.name()))?;
    let tree = parser
        .parse(src, None)
        .ok_or_else(|| "the parser gave no tree".to_string())?;
    if let Some(bad) = first_error(tree.root_node()) {
        let at = bad.start_position();
        return Err(format!(
            "a syntax error at line {}, column {}",
            at.row + 1,
            at.column + 1
        ));
    }
    Ok(tree)
}

fn first_error(node: Node<'_>) -> Option<Node<'_>> {
    if !node.has_error() {
        return None;
    }
    if node.is_error() || node.is_missing() {
        return Some(node);
    }
    let mut cursor = node.walk();
    let found = node.children(&mut cursor).find_map(first_error);
    found.or(Some(node))
}

/// What every level's comparison needs to know of the frozen file.
struct Context {
    /// Names the frozen file defines at its top level (a group's names are its own).
    top: BTreeSet<String>,
    /// Identifiers its tests use.
    used: BTreeSet<String>,
    /// The key path of the test a redo opens.
    open: Option<Vec<String>>,
}

impl Context {
    fn is_open(&self, scope: &[String], key: &str) -> bool {
        self.open.as_ref().is_some_and(|p| {
            p.len() == scope.len() + 1 && p[..scope.len()] == *scope && p[scope.len()] == key
        })
    }
}

/// One level: every frozen item stands in `new`; what `new` adds is allowed at a level holding
/// frozen tests.
fn compare_level(
    ctx: &Context,
    old: &[Item],
    new: &[Item],
    scope: &mut Vec<String>,
) -> Result<(), FrozenChange> {
    let mut taken = vec![false; new.len()];
    for o in old {
        let open = o.kind == Kind::Test && ctx.is_open(scope, &o.key);
        let found = new.iter().enumerate().position(|(i, n)| {
            !taken[i]
                && n.kind == o.kind
                && match o.kind {
                    Kind::Test | Kind::Group => n.key == o.key,
                    Kind::Hook | Kind::Shared => n.text == o.text,
                }
        });
        let Some(i) = found else {
            if open {
                continue;
            }
            return Err(gone(o, scope));
        };
        taken[i] = true;
        let n = &new[i];
        match o.kind {
            Kind::Test if !open && n.text != o.text => {
                return Err(FrozenChange(format!(
                    "the accepted {}{} was changed (its body, its decorators or marks, or how it is called); an accepted test stays exactly as accepted",
                    o.describe(),
                    in_scope(scope)
                )));
            }
            Kind::Group => {
                if n.text != o.text {
                    return Err(FrozenChange(format!(
                        "the header of {}{}, which holds accepted tests, was changed (a `.skip`, `.only`, a decorator, a base class or an argument); it stays as accepted",
                        o.describe(),
                        in_scope(scope)
                    )));
                }
                scope.push(o.key.clone());
                compare_level(ctx, &o.children, &n.children, scope)?;
                scope.pop();
            }
            _ => {}
        }
    }
    let bound: BTreeSet<&str> = ctx
        .top
        .iter()
        .map(String::as_str)
        .chain(old.iter().flat_map(|o| o.binds.iter().map(String::as_str)))
        .collect();
    for (n, _) in new.iter().zip(&taken).filter(|(_, t)| !**t) {
        added(ctx, (old, &bound), n, scope)?;
    }
    Ok(())
}

/// An item the frozen level does not hold; `bound` are the names defined at this level and at
/// the top.
fn added(
    ctx: &Context,
    (old, bound): (&[Item], &BTreeSet<&str>),
    n: &Item,
    scope: &[String],
) -> Result<(), FrozenChange> {
    let here = in_scope(scope);
    if n.exclusive {
        return Err(FrozenChange(format!(
            "the new {}{here} is marked to run alone (`.only`, `fit`, `fdescribe`), which would keep the accepted tests of the file from running; drop the mark",
            n.describe()
        )));
    }
    match n.kind {
        Kind::Hook => Err(FrozenChange(format!(
            "the new {}{here} would apply to the accepted tests of this file (a file-wide hook, an autouse fixture, a mock of a module, or code that runs when the file loads); give the new tests what they need inside a new group of their own (a `describe` block, a test class) or as a fixture they ask for by name",
            n.describe()
        ))),
        Kind::Test if old.iter().any(|o| o.kind == Kind::Test && o.key == n.key) => {
            Err(FrozenChange(format!(
                "the new {}{here} has the name of an accepted test; give it a name of its own",
                n.describe()
            )))
        }
        _ => match n
            .binds
            .iter()
            .find(|b| bound.contains(b.as_str()) || ctx.used.contains(*b))
        {
            Some(name) => Err(FrozenChange(format!(
                "the new {}{here} defines `{name}`, a name the accepted tests of this file {}; a definition of it would change what they run: choose another name",
                n.describe(),
                if bound.contains(name.as_str()) {
                    "already have defined"
                } else {
                    "use"
                }
            ))),
            None => Ok(()),
        },
    }
}

fn gone(o: &Item, scope: &[String]) -> FrozenChange {
    let here = in_scope(scope);
    FrozenChange(match o.kind {
        Kind::Test => format!(
            "the accepted {}{here} is gone (removed, renamed or moved); an accepted test stays where it is, as it is",
            o.describe()
        ),
        Kind::Group => format!(
            "{}{here}, which holds accepted tests, is gone or renamed; it stays as accepted",
            o.describe()
        ),
        Kind::Hook | Kind::Shared => format!(
            "{}{here}, which the accepted tests share, is gone or changed; imports, fixtures, hooks, helpers and module code stay exactly as accepted (add a new import or helper beside them instead)",
            o.describe()
        ),
    })
}

fn in_scope(scope: &[String]) -> String {
    if scope.is_empty() {
        String::new()
    } else {
        format!(" in `{}`", scope.join(" › "))
    }
}

// Helpers the language readers share.

pub(crate) fn text_of<'s>(node: Node<'_>, src: &'s str) -> &'s str {
    src.get(node.byte_range()).unwrap_or("")
}

pub(crate) fn first_line(text: &str) -> String {
    let line = text.lines().next().unwrap_or("").trim();
    if line.chars().count() > 80 {
        let cut: String = line.chars().take(77).collect();
        format!("{cut}…")
    } else {
        line.to_string()
    }
}

/// The text of `node` outside `body`: a group's header (and what follows its body).
pub(crate) fn outside(node: Node<'_>, body: Node<'_>, src: &str) -> String {
    let head = src.get(node.start_byte()..body.start_byte()).unwrap_or("");
    let tail = src.get(body.end_byte()..node.end_byte()).unwrap_or("");
    format!("{head}…{tail}")
}

/// The named children of `node`, comments left out.
pub(crate) fn children<'t>(node: Node<'t>) -> Vec<Node<'t>> {
    let mut cursor = node.walk();
    node.named_children(&mut cursor)
        .filter(|c| !c.kind().contains("comment"))
        .collect()
}

/// Every identifier under `node` whose kind is one of `kinds`, into `out`; the children in
/// field `skip_field` of nodes of kind `skip_parent` are left out (an attribute's name).
pub(crate) fn collect_identifiers(
    node: Node<'_>,
    src: &str,
    kinds: &[&str],
    skip: Option<(&str, &str)>,
    out: &mut BTreeSet<String>,
) {
    let mut stack = vec![node];
    while let Some(n) = stack.pop() {
        if kinds.contains(&n.kind()) {
            out.insert(text_of(n, src).to_string());
        }
        let skipped = skip
            .filter(|(parent, _)| n.kind() == *parent)
            .and_then(|(_, field)| n.child_by_field_name(field))
            .map(|c| c.id());
        let mut cursor = n.walk();
        for c in n.children(&mut cursor) {
            if Some(c.id()) != skipped {
                stack.push(c);
            }
        }
    }
}

/// The identifiers a test uses from outside itself, into `out`: every identifier of `kinds`
/// under `test` (see [`collect_identifiers`] for `skip`) but those it binds itself, at the
/// `sites` (node kind, and the field holding the bound names; None: the whole node).
pub(crate) fn test_uses(
    test: Node<'_>,
    src: &str,
    (kinds, skip): (&[&str], Option<(&str, &str)>),
    sites: &[(&str, Option<&str>)],
    out: &mut BTreeSet<String>,
) {
    let mut all = BTreeSet::new();
    collect_identifiers(test, src, kinds, skip, &mut all);
    let mut locals = BTreeSet::new();
    let mut stack = vec![test];
    while let Some(n) = stack.pop() {
        for (kind, field) in sites {
            if n.kind() == *kind {
                let bound = match field {
                    Some(f) => n.child_by_field_name(f),
                    None => Some(n),
                };
                if let Some(b) = bound {
                    collect_identifiers(b, src, kinds, skip, &mut locals);
                }
            }
        }
        let mut cursor = n.walk();
        stack.extend(n.children(&mut cursor));
    }
    out.extend(all.difference(&locals).cloned());
}

/// The unquoted value of a string literal (its raw text when it is not a plain one).
pub(crate) fn unquote(node: Node<'_>, src: &str) -> String {
    let raw = text_of(node, src);
    let t = raw.trim();
    for q in ["\"\"\"", "'''", "\"", "'", "`"] {
        if let Some(inner) = t.strip_prefix(q).and_then(|r| r.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    raw.to_string()
}

#[cfg(test)]
mod tests;
