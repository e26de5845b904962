//! The architecture invariants of ARCHITECTURE.md, checked against the code itself.
//!
//! * `consort-actors` knows no LLM and no database: no crate that talks to PostgreSQL or to a
//!   model is among its dependencies, however indirect (read from `cargo metadata`).
//! * The role agents and the branch backends do not know each other: neither `consort-agents`
//!   nor `consort-lakebase` depends on the other.
//! * The `consort` library has no command line, terminal, HTTP server or MCP server: none of
//!   the crates that bring them is among its dependencies (they are `consort-cli`'s).
//! * The core is pure: no file in `consort-actors/src/core/` (the state machine, its rules, the
//!   artifacts, budgets and context packs) uses tokio, the file system, the environment or a
//!   clock.
//! * An error returns its cause from `source()` or says it in its own text, never both, so
//!   `consort_actors::error_chain` says each cause once.
//!
//! Each check is a function over plain data, tested once against the real workspace and once
//! against a copy broken on purpose, so a check that could never fail would be caught.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use consort_testkit::process::succeeded;
use consort_testkit::sources::{crate_paths, rust_sources, without_tests};
use serde_json::Value;

/// Crates that reach a database.
const DATABASE_CRATES: &[&str] = &[
    "tokio-postgres",
    "postgres",
    "postgres-protocol",
    "sqlx",
    "diesel",
    "rusqlite",
    "deadpool-postgres",
    "sea-orm",
];

/// Crates that reach a model (or an HTTP client to reach one with).
const LLM_CRATES: &[&str] = &["async-openai", "reqwest", "hyper", "ollama-rs", "anthropic"];

/// Crates of the command line, the terminal, the HTTP server and the MCP server: the
/// `consort-cli` package's, never the library's.
const FRONT_END_CRATES: &[&str] = &["clap", "indicatif", "axum", "rmcp", "consort-cli"];

/// Names in the state machine's source that mean I/O, the environment or a clock.
const IMPURE: &[&str] = &[
    "tokio",
    "std::fs",
    "fs::",
    "std::env",
    "env::",
    "SystemTime",
    "Instant",
];

/// The workspace's `cargo metadata`.
fn metadata() -> Value {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = succeeded(
        Command::new(cargo)
            .args(["metadata", "--format-version", "1", "--locked"])
            .current_dir(env!("CARGO_MANIFEST_DIR")),
        "cargo metadata",
    );
    serde_json::from_slice(&out.stdout).expect("cargo metadata prints JSON")
}

/// Every package's name by id, and its normal and build dependencies (not dev) by id.
struct Graph {
    names: BTreeMap<String, String>,
    deps: BTreeMap<String, Vec<String>>,
}

impl Graph {
    fn from_metadata(meta: &Value) -> Graph {
        let names = meta["packages"]
            .as_array()
            .expect("packages")
            .iter()
            .map(|p| (str_at(p, "id"), str_at(p, "name")))
            .collect();
        let deps = meta["resolve"]["nodes"]
            .as_array()
            .expect("resolve nodes")
            .iter()
            .map(|node| {
                let linked = node["deps"]
                    .as_array()
                    .expect("deps")
                    .iter()
                    .filter(|d| {
                        d["dep_kinds"]
                            .as_array()
                            .expect("dep_kinds")
                            .iter()
                            .any(|k| k["kind"].is_null() || k["kind"] == "build")
                    })
                    .map(|d| str_at(d, "pkg"))
                    .collect();
                (str_at(node, "id"), linked)
            })
            .collect();
        Graph { names, deps }
    }

    fn id_of(&self, name: &str) -> String {
        self.names
            .iter()
            .find(|(_, n)| n.as_str() == name)
            .map(|(id, _)| id.clone())
            .unwrap_or_else(|| panic!("no package {name} in the workspace"))
    }

    /// The names of everything `name` depends on, directly or not (dev-dependencies aside).
    fn reaches(&self, name: &str) -> BTreeSet<String> {
        let mut seen = BTreeSet::new();
        let mut todo = vec![self.id_of(name)];
        while let Some(id) = todo.pop() {
            for dep in self.deps.get(&id).into_iter().flatten() {
                if seen.insert(dep.clone()) {
                    todo.push(dep.clone());
                }
            }
        }
        seen.iter().map(|id| self.names[id].clone()).collect()
    }
}

fn str_at(v: &Value, key: &str) -> String {
    v[key]
        .as_str()
        .unwrap_or_else(|| panic!("{key} is a string"))
        .to_string()
}

/// Every dependency that breaks a crate boundary, one line each.
fn boundary_violations(graph: &Graph) -> Vec<String> {
    let mut found = Vec::new();
    let actors = graph.reaches("consort-actors");
    for name in DATABASE_CRATES
        .iter()
        .chain(LLM_CRATES)
        .chain(&["consort-agents", "consort-lakebase"])
    {
        if actors.contains(*name) {
            found.push(format!("consort-actors depends on {name}"));
        }
    }
    for (from, to) in [
        ("consort-agents", "consort-lakebase"),
        ("consort-lakebase", "consort-agents"),
    ] {
        if graph.reaches(from).contains(to) {
            found.push(format!("{from} depends on {to}"));
        }
    }
    let library = graph.reaches("consort");
    for name in FRONT_END_CRATES {
        if library.contains(*name) {
            found.push(format!("consort depends on {name}"));
        }
    }
    found
}

/// Every use of an impure name in one source file, as `line: text`, comments aside.
fn impure_uses(source: &str) -> Vec<String> {
    source
        .lines()
        .enumerate()
        .filter_map(|(i, line)| {
            let code = line.split("//").next().unwrap_or_default();
            IMPURE
                .iter()
                .find(|name| contains_word(code, name))
                .map(|name| format!("line {}: {name} in `{}`", i + 1, line.trim()))
        })
        .collect()
}

/// Whether `name` stands in `code` with no identifier character right before or after it.
fn contains_word(code: &str, name: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    code.match_indices(name).any(|(at, _)| {
        let before = code[..at].chars().next_back();
        let after = code[at + name.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(|c| ident(c) && !name.ends_with("::"))
    })
}

/// Adds to `meta` a dependency of the package `from` on the package `to`, of `kind` (`None`:
/// a normal one), as `cargo metadata` writes one.
fn add_dependency(meta: &mut Value, from: &str, to: &str, kind: Option<&str>) {
    let graph = Graph::from_metadata(meta);
    let (from, to) = (graph.id_of(from), graph.id_of(to));
    let node = meta["resolve"]["nodes"]
        .as_array_mut()
        .expect("nodes")
        .iter_mut()
        .find(|node| node["id"] == from.as_str())
        .expect("the package is in the resolve graph");
    let dep = serde_json::json!({"pkg": to, "dep_kinds": [{"kind": kind}]});
    node["deps"].as_array_mut().expect("deps").push(dep);
}

#[test]
fn crate_boundaries_hold() {
    let graph = Graph::from_metadata(&metadata());
    assert_eq!(boundary_violations(&graph), Vec::<String>::new());
}

#[test]
fn a_database_crate_under_the_runtime_is_caught() {
    let mut meta = metadata();
    add_dependency(&mut meta, "consort-actors", "tokio-postgres", None);
    add_dependency(&mut meta, "consort-agents", "consort-lakebase", None);
    add_dependency(&mut meta, "consort-lakebase", "clap", None);
    let found = boundary_violations(&Graph::from_metadata(&meta));
    for expected in [
        "consort-actors depends on tokio-postgres",
        // Indirect dependencies count: tokio-postgres brings postgres-protocol.
        "consort-actors depends on postgres-protocol",
        "consort-agents depends on consort-lakebase",
        // The library reaches the command line's crates through any of its dependencies.
        "consort depends on clap",
    ] {
        assert!(
            found.contains(&expected.to_string()),
            "{expected}: {found:?}"
        );
    }
}

#[test]
fn a_dev_dependency_does_not_count() {
    let mut meta = metadata();
    add_dependency(&mut meta, "consort-actors", "tokio-postgres", Some("dev"));
    assert_eq!(
        boundary_violations(&Graph::from_metadata(&meta)),
        Vec::<String>::new()
    );
}

#[test]
fn the_state_machine_does_no_io_and_reads_no_clock() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("consort-actors/src/core");
    let files = rust_sources(&dir);
    assert!(
        files.len() >= 15,
        "the core's sources are at {}",
        dir.display()
    );
    let mut found = Vec::new();
    for (rel, source) in files {
        for hit in impure_uses(&source) {
            found.push(format!("core/{rel}: {hit}"));
        }
    }
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn impure_code_in_the_machine_is_caught() {
    let source = "use tokio::time;\n\
                  let now = std::time::Instant::now();\n\
                  let t = SystemTime::now();\n\
                  let text = fs::read_to_string(p);\n\
                  let key = std::env::var(\"K\");\n\
                  // a comment may say tokio and Instant\n\
                  let instantly = phase.tokio_free();\n";
    let found = impure_uses(source);
    assert_eq!(found.len(), 5, "{found:#?}");
    assert!(found[0].starts_with("line 1: tokio"), "{found:?}");
    assert!(found[4].starts_with("line 5: std::env"), "{found:?}");
}

/// The workspace's packages by directory, each with the heading that starts its part of
/// ARCHITECTURE.md's code map.
const PACKAGES: &[(&str, &str)] = &[
    ("", "`consort` (root package)"),
    ("consort-actors", "`consort-actors/`"),
    ("consort-agents", "`consort-agents/`"),
    ("consort-lakebase", "`consort-lakebase/`"),
    ("consort-cli", "`consort-cli/`"),
    ("consort-testkit", "`consort-testkit/`"),
];

/// The code map's part for the package whose heading starts with `heading`: the text from that
/// `### ` heading to the next heading.
fn map_section<'a>(architecture: &'a str, heading: &str) -> Option<&'a str> {
    let start = architecture.find(&format!("\n### {heading}"))? + 1;
    let rest = &architecture[start..];
    let end = rest[4..].find("\n#").map_or(rest.len(), |at| at + 4);
    Some(&rest[..end])
}

/// Every source file (relative to its package's `src/`) the code map does not name in its
/// package's part, as `package/src/path`. A file counts as named when its part holds its path,
/// its name after a backtick or a slash (`` `cache.rs `` inside `` `worktree/cache.rs` ``), or,
/// for a `mod.rs`, its directory (`` `machine/` ``). The crate roots and unit-test files
/// (`tests.rs`) need no entry.
fn unmapped(architecture: &str, package: &str, heading: &str, sources: &[String]) -> Vec<String> {
    let section = map_section(architecture, heading).unwrap_or_default();
    sources
        .iter()
        .filter(|rel| {
            let name = rel.rsplit('/').next().unwrap_or(rel);
            if matches!(name, "lib.rs" | "main.rs" | "tests.rs") {
                return false;
            }
            let named = if name == "mod.rs" {
                let dir = rel.trim_end_matches("mod.rs");
                let dir_name = dir.trim_end_matches('/').rsplit('/').next().unwrap_or(dir);
                section.contains(&format!("`{dir_name}/"))
            } else {
                section.contains(&format!("`{name}"))
                    || section.contains(&format!("/{name}`"))
                    || section.contains(&format!("`{rel}`"))
            };
            !named
        })
        .map(|rel| {
            format!(
                "{}src/{rel}",
                if package.is_empty() {
                    String::new()
                } else {
                    format!("{package}/")
                }
            )
        })
        .collect()
}

/// The `.rs` files under `package/src`, relative to it, with `/` between names.
fn package_sources(package: &str) -> Vec<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(package)
        .join("src");
    rust_sources(&src).into_iter().map(|(rel, _)| rel).collect()
}

fn architecture() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("ARCHITECTURE.md"))
        .expect("ARCHITECTURE.md is readable")
}

#[test]
fn the_code_map_names_every_source_file() {
    let architecture = architecture();
    let mut missing = Vec::new();
    for (package, heading) in PACKAGES {
        assert!(
            map_section(&architecture, heading).is_some(),
            "ARCHITECTURE.md has a code map part headed {heading}"
        );
        let sources = package_sources(package);
        assert!(!sources.is_empty(), "{package} has sources");
        missing.extend(unmapped(&architecture, package, heading, &sources));
    }
    assert_eq!(
        missing,
        Vec::<String>::new(),
        "ARCHITECTURE.md's code map lacks these files"
    );
}

#[test]
fn a_source_file_the_code_map_does_not_name_is_caught() {
    let architecture = architecture();
    let mut sources = package_sources("consort-actors");
    sources.push("machine/forgotten.rs".into());
    sources.push("forgotten_dir/mod.rs".into());
    let missing = unmapped(
        &architecture,
        "consort-actors",
        "`consort-actors/`",
        &sources,
    );
    assert_eq!(
        missing,
        [
            "consort-actors/src/machine/forgotten.rs",
            "consort-actors/src/forgotten_dir/mod.rs",
        ]
    );
    // A file named only in another package's part does not count.
    let cli = unmapped(
        &architecture,
        "consort-cli",
        "`consort-cli/`",
        &["ledger.rs".into()],
    );
    assert_eq!(cli, ["consort-cli/src/ledger.rs"]);
}

/// The packages whose top-level modules must not import each other in a circle.
const ACYCLIC: &[&str] = &["", "consort-cli"];

/// Every circle among the top-level modules of a package's sources ((path under `src/`, text)),
/// as its modules joined by ` -> `. A module is the first name of a file's path (`config.rs`
/// and `config/…` are `config`); the crate roots and unit-test modules do not count.
fn module_circles(sources: &[(String, String)]) -> Vec<String> {
    let module = |rel: &str| {
        let first = rel.split('/').next().unwrap_or(rel);
        first.strip_suffix(".rs").unwrap_or(first).to_string()
    };
    let mut uses: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (rel, text) in sources {
        let from = module(rel);
        if matches!(from.as_str(), "lib" | "main") || rel.ends_with("/tests.rs") {
            continue;
        }
        let named = crate_paths(without_tests(text))
            .into_iter()
            .map(|(_, name)| name);
        let entry = uses.entry(from.clone()).or_default();
        entry.extend(named.filter(|name| *name != from));
    }
    let mut circles = BTreeSet::new();
    for start in uses.keys() {
        // Depth-first from `start`, reporting each path that comes back to it.
        let mut stack = vec![vec![start.clone()]];
        while let Some(path) = stack.pop() {
            let last = path.last().expect("a path has a module");
            for next in uses.get(last).into_iter().flatten() {
                if next == start {
                    let mut circle = path.clone();
                    let low = (0..circle.len()).min_by_key(|i| &circle[*i]).unwrap_or(0);
                    circle.rotate_left(low);
                    circle.push(circle[0].clone());
                    circles.insert(circle.join(" -> "));
                } else if uses.contains_key(next) && !path.contains(next) {
                    let mut longer = path.clone();
                    longer.push(next.clone());
                    stack.push(longer);
                }
            }
        }
    }
    circles.into_iter().collect()
}

#[test]
fn the_library_and_the_program_have_no_import_circles() {
    for package in ACYCLIC {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(package)
            .join("src");
        let sources = rust_sources(&src);
        assert!(sources.len() > 5, "{package} has sources");
        assert_eq!(
            module_circles(&sources),
            Vec::<String>::new(),
            "{}",
            src.display()
        );
    }
}

#[test]
fn an_import_circle_is_caught() {
    let file = |rel: &str, text: &str| (rel.to_string(), text.to_string());
    let sources = [
        file("project.rs", "use crate::git::GitRepo;\n"),
        file("git.rs", "fn f(p: &crate::project::Project) {}\n"),
        file(
            "config.rs",
            "use crate::{backlog::Feature, runlock::RunLock};\n",
        ),
        file("config/runner.rs", "// crate::project in a comment\n"),
        file(
            "backlog.rs",
            "#[cfg(test)]\nmod tests { use crate::config::x; }\n",
        ),
        file("runlock.rs", "use crate::backlog::y;\n"),
        file("lib.rs", "use crate::config::z;\n"),
    ];
    assert_eq!(module_circles(&sources), ["git -> project -> git"]);
}

/// The end of the bracket opened just before `code[open..]`: skips string literals (and their
/// escapes) and counts `(`, `[` and `{` against their closers.
fn closing(code: &str, open: usize) -> usize {
    let (mut depth, mut in_string, mut escaped) = (1usize, false, false);
    for (i, c) in code[open..].char_indices() {
        if in_string {
            match c {
                _ if escaped => escaped = false,
                '\\' => escaped = true,
                '"' => in_string = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => in_string = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// The fields between a bracket at `code[open - 1]` and its closer, split at the commas of
/// that level (not those of a type's `<…>`).
fn fields(code: &str, open: usize) -> Vec<&str> {
    let close = closing(code, open);
    let mut out = Vec::new();
    let mut start = open;
    while start < close {
        let mut end = start;
        let mut depth = 0usize;
        let mut in_string = false;
        let mut previous = ' ';
        for (i, c) in code[start..close].char_indices() {
            end = start + i + c.len_utf8();
            let arrow = matches!(previous, '-' | '=');
            previous = c;
            match c {
                '"' => in_string = !in_string,
                '(' | '[' | '{' | '<' if !in_string => depth += 1,
                '>' if arrow => {}
                ')' | ']' | '}' | '>' if !in_string => depth = depth.saturating_sub(1),
                ',' if !in_string && depth == 0 => {
                    end -= 1;
                    break;
                }
                _ => {}
            }
        }
        out.push(&code[start..end]);
        start = end + 1;
    }
    out
}

/// The name of the field an error returns from `source()` in `item`, the text of one variant
/// (or struct) after its `#[error(…)]`: a field marked `#[source]` or `#[from]`, or named
/// `source`; a tuple field by its index.
fn source_field(item: &str) -> Option<String> {
    let open = item.find(['(', '{', ','])?;
    let tuple = match &item[open..=open] {
        "(" => true,
        "{" => false,
        _ => return None,
    };
    fields(item, open + 1)
        .into_iter()
        .enumerate()
        .find_map(|(i, field)| {
            let marked = field.contains("#[source]") || field.contains("#[from]");
            if tuple {
                return marked.then(|| i.to_string());
            }
            let name = field.rsplit(']').next()?.split(':').next()?.trim();
            let name = name.strip_prefix("pub ").unwrap_or(name).trim();
            (marked || name == "source").then(|| name.to_string())
        })
}

/// Every `#[error(…)]` in `source` (its unit tests aside) whose text prints the field the error
/// returns from `source()`, as `line N: field`: that error's cause would be said twice in a
/// chain. An error returns its cause or says it, never both; `#[error(transparent)]` forwards
/// both.
fn causes_said_twice(source: &str) -> Vec<String> {
    let code: String = without_tests(source)
        .lines()
        .map(|line| match line.trim_start().starts_with("//") {
            true => "",
            false => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for (start, _) in code.match_indices("#[error(") {
        let open = start + "#[error(".len();
        let close = closing(&code, open);
        let attr = &code[open..close];
        if attr.trim() == "transparent" {
            continue;
        }
        let rest = &code[close..];
        let end = [rest[1..].find("#[error("), rest.find("\n}")]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(rest.len());
        let Some(field) = source_field(&rest[..end]) else {
            continue;
        };
        let args = attr.rfind('"').map_or("", |at| &attr[at + 1..]);
        let said = attr.contains(&format!("{{{field}}}"))
            || attr.contains(&format!("{{{field}:"))
            || contains_word(args, &field)
            || args.contains(&format!(".{field}"));
        if said {
            let line = code[..start].matches('\n').count() + 1;
            found.push(format!("line {line}: {field}"));
        }
    }
    found
}

#[test]
fn every_error_says_its_cause_once() {
    let mut found = Vec::new();
    for (package, _) in PACKAGES {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join(package)
            .join("src");
        for (rel, source) in rust_sources(&src) {
            for hit in causes_said_twice(&source) {
                found.push(format!("{}: {hit}", src.join(&rel).display()));
            }
        }
    }
    assert_eq!(found, Vec::<String>::new());
}

#[test]
fn an_error_that_says_its_cause_twice_is_caught() {
    let source = r#"
pub enum E {
    /// Says its source: caught.
    #[error("cannot read {path}: {source}")]
    Read { path: PathBuf, #[source] source: io::Error },
    /// Says it through a function: caught.
    #[error("failed: {}", text(cause))]
    Driver { #[source] cause: pg::Error },
    /// A tuple's source, by its index: caught.
    #[error("database: {0}")]
    Database(#[from] lakebase::Error),
    /// Leaves it to the chain: fine.
    #[error("cannot write {path}")]
    Write { path: PathBuf, source: io::Error },
    /// Forwards both: fine.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Says a field that is no source: fine.
    #[error("git {args} failed: {0}", args = "x")]
    Git(String, Vec<String>),
}
"#;
    assert_eq!(
        causes_said_twice(source),
        ["line 4: source", "line 7: cause", "line 10: 0"]
    );
}
