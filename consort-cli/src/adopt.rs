//! Adopting an existing repository: what `consort init` finds in a directory that already has
//! code — the stack, its tests, a test command with per-test results, existing migrations — and
//! the `consort.toml` sections it writes for them.
//!
//! Detection only reads the directory (a few manifest files and a listing, caches and version
//! control skipped); it never runs the project's tools. `consort doctor` does that, once, to
//! check that the command collects tests ([`crate::collect`]).

use std::path::Path;

/// The stacks `consort init` recognises, in the order it looks for them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stack {
    /// A Cargo package or workspace: `cargo test`, each result from libtest's lines.
    Cargo,
    /// Python tests: pytest with a JUnit report.
    Pytest,
    /// Node with vitest: its JUnit reporter.
    Vitest,
    /// Node with jest: the jest-junit reporter.
    Jest,
    /// A Go module: `go test -json`.
    Go,
    /// Plain SQL tests: each file with psql.
    Psql,
}

impl Stack {
    /// The stack's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            Stack::Cargo => "Rust (cargo test)",
            Stack::Pytest => "Python (pytest)",
            Stack::Vitest => "Node (vitest)",
            Stack::Jest => "Node (jest)",
            Stack::Go => "Go (go test)",
            Stack::Psql => "plain SQL (psql)",
        }
    }
}

/// The project-specific sections of `consort.toml`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// What was detected (None: the template's defaults).
    pub stack: Option<Stack>,
    /// `[paths] tests`.
    pub tests: Vec<String>,
    /// The whole `[runner]` section.
    pub runner: String,
    /// The whole `[migrations]` section.
    pub migrations: String,
    /// The `[branch_env]` section, when the project reads its database under names of its
    /// own (empty otherwise).
    pub branch_env: String,
    /// What `consort init` tells the user about it, a line each.
    pub notes: Vec<String>,
}

/// The template's `[runner]`: psql, with the command runner's keys as comments.
const PSQL_RUNNER: &str = r#"[runner]
kind = "psql"                   # "psql": each tests/*.sql file with psql on a fresh branch
setup = ["src/**/*.sql"]        # code loaded into the branch before the tests
tests = ["tests/**/*.sql"]
timeout_secs = 60
# sandbox = "off"               # runs are confined with Landlock; "off" only where the kernel lacks it
# kind = "command"              # or your own test command:
# command = "pytest -q --junitxml=\"$CONSORT_JUNIT\""
# junit = "junit.xml"           # per-test outcomes from JUnit XML, written in the run's report
#                               #   directory ($CONSORT_REPORT_DIR; never the tree), or tap = true
# stdout = "libtest"            #   or read from standard output: "tap", "libtest", "go-test-json"
# single_test = "pytest -q {test}"
# pass_env = ["APP_SECRET"]     # variables passed through to the tests; every run also gets its
# env_set = { APP_ENV = "test" } #   branch as DATABASE_URL and PGHOST/PGPORT/PGUSER/PGPASSWORD/
#                               #   PGDATABASE (guide: The database the tests get)
"#;

/// Where the design's migrations go when the project has none yet.
const DEFAULT_MIGRATIONS: &str = "migrations";

impl Default for Layout {
    fn default() -> Self {
        Layout {
            stack: None,
            tests: vec!["tests/**".into()],
            runner: PSQL_RUNNER.into(),
            migrations: migrations_section(DEFAULT_MIGRATIONS, false),
            branch_env: String::new(),
            notes: Vec::new(),
        }
    }
}

fn migrations_section(dir: &str, found: bool) -> String {
    let comment = if found {
        "# the project's migrations, found by `consort init`"
    } else {
        "# where the approved design's migrations are written"
    };
    format!(
        "[migrations]\ndir = {dir:?}{pad}{comment}, as NNNN_<story>_<name>.sql\napply_existing = true          # the .sql files already there are applied first, in version order\npromote_existing = true        # and to the parent at promotion (false when it has them already)\n",
        pad = " ".repeat(24usize.saturating_sub(dir.len() + 8).max(1)),
    )
}

/// What `dir` holds: the layout `consort init` writes for it (the template's when nothing is
/// recognised).
pub fn detect(dir: &Path) -> Layout {
    let mut layout = Layout::default();
    let found = [
        (Stack::Cargo, dir.join("Cargo.toml").is_file()),
        (Stack::Pytest, is_pytest(dir)),
        (Stack::Vitest, node_uses(dir, "vitest")),
        (Stack::Jest, node_uses(dir, "jest")),
        (Stack::Go, dir.join("go.mod").is_file()),
        (Stack::Psql, has_sql_tests(dir)),
    ];
    let stacks: Vec<Stack> = found.iter().filter(|(_, f)| *f).map(|(s, _)| *s).collect();
    if let Some(&stack) = stacks.first() {
        layout.stack = Some(stack);
        layout.tests = test_paths(dir, stack);
        layout.runner = runner_section(dir, stack, &layout.tests);
        layout.notes.push(format!("detected {}", stack.name()));
        for other in &stacks[1..] {
            layout.notes.push(format!(
                "also found {}; this configuration runs the first (edit [runner] to change it)",
                other.name()
            ));
        }
        if stack == Stack::Cargo && !dir.join("Cargo.lock").is_file() {
            layout.notes.push("no Cargo.lock: a run cannot write the work tree, so generate and commit one (cargo generate-lockfile)".into());
        }
    }
    let tools = crate::migration_tools::detect(dir);
    if let Some(section) = tools.first().and_then(|t| t.section()) {
        layout.migrations = section;
    } else if let Some((mdir, count)) = existing_migrations(dir) {
        layout.migrations = migrations_section(&mdir, true);
        layout.notes.push(format!(
            "found {count} migration file(s) in {mdir}/: applied to every branch before the design's"
        ));
    }
    layout
        .notes
        .extend(tools.iter().map(crate::migration_tools::FoundTool::note));
    let names = crate::branch_env_found::detect(dir);
    if let Some(section) = names.section() {
        layout.branch_env = section;
        layout.notes.push(names.note());
    }
    layout
}

fn is_pytest(dir: &Path) -> bool {
    let mentions = |file: &str, what: &str| {
        std::fs::read_to_string(dir.join(file)).is_ok_and(|t| t.contains(what))
    };
    dir.join("pytest.ini").is_file()
        || dir.join("conftest.py").is_file()
        || mentions("pyproject.toml", "pytest")
        || mentions("setup.cfg", "pytest")
        || mentions("tox.ini", "pytest")
        || [
            "requirements.txt",
            "requirements-dev.txt",
            "requirements_dev.txt",
        ]
        .iter()
        .any(|f| mentions(f, "pytest"))
        || files_under(dir, 3)
            .iter()
            .any(|f| f.ends_with(".py") && file_name(f).starts_with("test_"))
}

fn node_uses(dir: &Path, tool: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(dir.join("package.json")) else {
        return false;
    };
    let Ok(json) = serde_json::from_str::<serde_json::Value>(&text) else {
        return false;
    };
    ["dependencies", "devDependencies"]
        .iter()
        .any(|k| json.get(k).and_then(|d| d.get(tool)).is_some())
}

fn has_sql_tests(dir: &Path) -> bool {
    files_under(&dir.join("tests"), 3)
        .iter()
        .any(|f| f.ends_with(".sql"))
}

/// The test paths: the project's `tests/` (or `test/`) when it has one; for Go, its `_test.go`
/// files wherever they are.
/// `[paths] tests` for a project of `stack`: each test directory it has at the top
/// (`tests/`, `test/`, `__tests__/`), and, where test files of the stack's naming lie outside
/// them (`src/components/__tests__/a.test.js`, `app/test_orders.py`), the stack's patterns
/// too, so that what the runner collects is what Consort calls a test.
fn test_paths(dir: &Path, stack: Stack) -> Vec<String> {
    if stack == Stack::Go {
        return vec!["**/*_test.go".into()];
    }
    let dirs: Vec<&str> = ["tests", "test", "__tests__"]
        .into_iter()
        .filter(|c| dir.join(c).is_dir())
        .collect();
    let root = format!("{}/", dir.display());
    let loose = files_under(dir, 6).into_iter().any(|f| {
        let rel = f.strip_prefix(&root).unwrap_or(&f);
        looks_like_a_test(stack, rel) && !dirs.iter().any(|d| rel.starts_with(&format!("{d}/")))
    });
    let mut paths: Vec<String> = dirs.iter().map(|d| format!("{d}/**")).collect();
    if loose || paths.is_empty() {
        paths.extend(match stack {
            Stack::Pytest => vec!["**/test_*.py".into(), "**/*_test.py".into()],
            Stack::Vitest | Stack::Jest => vec![
                "**/__tests__/**".into(),
                "**/*.test.*".into(),
                "**/*.spec.*".into(),
            ],
            _ if paths.is_empty() => vec!["tests/**".into()],
            _ => Vec::new(),
        });
    }
    paths
}

/// Whether `rel` is named as the stack's test tool finds tests.
fn looks_like_a_test(stack: Stack, rel: &str) -> bool {
    let name = file_name(rel);
    match stack {
        Stack::Pytest => {
            name.ends_with(".py") && (name.starts_with("test_") || name.ends_with("_test.py"))
        }
        Stack::Vitest | Stack::Jest => {
            rel.contains("__tests__/") || name.contains(".test.") || name.contains(".spec.")
        }
        _ => false,
    }
}

/// The Python a pytest project's tests run with: its own virtual environment's, by a path in
/// its tree (every lane links the same one in), when it has one; else `python3` from `PATH`.
fn python_of(dir: &Path) -> &'static str {
    if dir.join(consort_lakebase::PROJECT_PYTHON).exists() {
        consort_lakebase::PROJECT_PYTHON
    } else {
        "python3"
    }
}

fn runner_section(dir: &Path, stack: Stack, tests: &[String]) -> String {
    let head = format!(
        "[runner]                        # {}: detected by `consort init`\nkind = \"command\"\n",
        stack.name()
    );
    let body = match stack {
        Stack::Cargo => cargo_runner(),
        Stack::Pytest => format!(
            "command = \"{} -m pytest -q -p no:cacheprovider --junitxml=\\\"$CONSORT_JUNIT\\\"\"\njunit = \"junit.xml\"             # pytest's JUnit report, in the run's report directory\ntap = false\n",
            python_of(dir)
        ),
        Stack::Vitest => "command = \"npx vitest run --reporter=junit --outputFile=\\\"$CONSORT_JUNIT\\\"\"\njunit = \"junit.xml\"             # vitest's JUnit reporter, in the run's report directory\ntap = false\n".to_string(),
        Stack::Jest => "command = \"JEST_JUNIT_OUTPUT_FILE=\\\"$CONSORT_JUNIT\\\" JEST_JUNIT_CLASSNAME=\\\"{filepath}\\\" npx jest --ci --reporters=default --reporters=jest-junit\"\njunit = \"junit.xml\"             # jest-junit's report (npm install --save-dev jest-junit)\ntap = false\n".to_string(),
        Stack::Go => "command = \"go test -json ./...\"\nstdout = \"go-test-json\"        # each test's result from go test's JSON events\n".to_string(),
        Stack::Psql => {
            let setup = sql_code_globs(dir);
            return format!(
                "[runner]                        # {}: detected by `consort init`\nkind = \"psql\"\nsetup = {}        # code loaded into the branch before the tests\ntests = {}\ntimeout_secs = 60\n",
                stack.name(),
                toml_list(&setup),
                toml_list(&sql_test_globs(tests)),
            );
        }
    };
    format!(
        "{head}{body}timeout_secs = 600\n# pass_env = [\"APP_SECRET\"]     # variables passed through; every run also gets its branch as\n# env_set = {{ APP_ENV = \"test\" }} #   DATABASE_URL and PGHOST/PGPORT/PGUSER/PGPASSWORD/PGDATABASE\n"
    )
}

/// `cargo test` as a confined run can make it: offline, building in the run's scratch
/// directory (a run may not write the work tree, and no build of one run is reused by the
/// next), with the toolchain found where it is installed.
fn cargo_runner() -> String {
    let home = std::env::var("HOME").unwrap_or_default();
    let cargo_home = std::env::var("CARGO_HOME").unwrap_or_else(|_| format!("{home}/.cargo"));
    let rustup_home = std::env::var("RUSTUP_HOME").unwrap_or_else(|_| format!("{home}/.rustup"));
    format!(
        "command = \"cargo test --offline --no-fail-fast --color never --target-dir \\\"$TMPDIR/target\\\"\"\nstdout = \"libtest\"             # each test's result from libtest's `test <name> ... ok` lines\nenv_set = {{ CARGO_HOME = {cargo_home:?}, RUSTUP_HOME = {rustup_home:?} }} # the toolchain (a run has its own HOME)\n"
    )
}

/// The `.sql` files of the test paths (`tests/**` → `tests/**/*.sql`).
fn sql_test_globs(tests: &[String]) -> Vec<String> {
    tests
        .iter()
        .map(|t| format!("{}/**/*.sql", t.trim_end_matches("/**")))
        .collect()
}

/// The SQL code the psql runner loads: `src/` or `sql/` when they hold SQL.
fn sql_code_globs(dir: &Path) -> Vec<String> {
    let found: Vec<String> = ["src", "sql", "db/functions"]
        .iter()
        .filter(|d| {
            files_under(&dir.join(d), 4)
                .iter()
                .any(|f| f.ends_with(".sql"))
        })
        .map(|d| format!("{d}/**/*.sql"))
        .collect();
    if found.is_empty() {
        vec!["src/**/*.sql".into()]
    } else {
        found
    }
}

/// A directory of existing SQL migrations (sqlx, refinery, Flyway, dbmate, goose, …) and how
/// many `.sql` files it holds.
fn existing_migrations(dir: &Path) -> Option<(String, usize)> {
    [
        "migrations",
        "db/migrations",
        "db/migrate",
        "sql/migrations",
        "src/main/resources/db/migration",
        "database/migrations",
    ]
    .iter()
    .find_map(|m| {
        let count = std::fs::read_dir(dir.join(m))
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".sql"))
            .count();
        (count > 0).then(|| (m.to_string(), count))
    })
}

/// Files under `dir` to `depth` levels, caches and version control skipped (paths as text).
fn files_under(dir: &Path, depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    let filter = consort_actors::TreeFilter::default();
    let mut todo = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, level)) = todo.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Ok(kind) = e.file_type() else { continue };
            if kind.is_dir() && level + 1 < depth && !filter.skips(&name) {
                todo.push((e.path(), level + 1));
            } else if kind.is_file() {
                out.push(e.path().to_string_lossy().into_owned());
            }
        }
        if out.len() > 10_000 {
            break;
        }
    }
    out
}

fn file_name(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

/// A TOML array of strings, each quoted and escaped as TOML writes it.
pub(crate) fn toml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items
        .iter()
        .map(|i| toml::Value::String(i.clone()).to_string())
        .collect();
    format!("[{}]", quoted.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_toml_list_reads_back_as_the_paths_written() {
        let items: Vec<String> = [
            "tests/**/*.sql",
            "we\"ird\\path",
            "tésts/🦀/*.py",
            "tab\there",
        ]
        .map(String::from)
        .to_vec();
        let text = format!("list = {}", toml_list(&items));
        let table: toml::Table = text.parse().expect("valid TOML");
        let read: Vec<String> = table["list"]
            .as_array()
            .expect("an array")
            .iter()
            .map(|v| v.as_str().expect("a string").to_string())
            .collect();
        assert_eq!(read, items, "{text}");
    }

    fn write(dir: &Path, files: &[(&str, &str)]) {
        for (p, text) in files {
            let path = dir.join(p);
            std::fs::create_dir_all(path.parent().expect("parent")).expect("dir");
            std::fs::write(path, text).expect("write");
        }
    }

    fn layout_of(files: &[(&str, &str)]) -> Layout {
        detect(tempdir_with(files).path())
    }

    fn tempdir_with(files: &[(&str, &str)]) -> tempfile::TempDir {
        let tmp = tempfile::tempdir().expect("tmp");
        write(tmp.path(), files);
        tmp
    }

    #[test]
    fn each_stack_is_detected_with_a_per_test_command() {
        let cargo = layout_of(&[
            ("Cargo.toml", "[package]\nname = \"x\"\n"),
            ("tests/a.rs", ""),
        ]);
        assert_eq!(cargo.stack, Some(Stack::Cargo));
        assert!(
            cargo.runner.contains("stdout = \"libtest\""),
            "{}",
            cargo.runner
        );
        assert!(cargo.notes.iter().any(|n| n.contains("Cargo.lock")));
        let py = layout_of(&[
            ("pyproject.toml", "[tool.pytest.ini_options]\n"),
            ("tests/test_a.py", ""),
        ]);
        assert_eq!(py.stack, Some(Stack::Pytest));
        assert!(py.runner.contains("--junitxml"), "{}", py.runner);
        let vitest = layout_of(&[("package.json", r#"{"devDependencies":{"vitest":"^2"}}"#)]);
        assert_eq!(vitest.stack, Some(Stack::Vitest));
        assert!(vitest.runner.contains("--reporter=junit"));
        assert_eq!(
            vitest.tests,
            ["**/__tests__/**", "**/*.test.*", "**/*.spec.*"]
        );
        let jest = layout_of(&[("package.json", r#"{"devDependencies":{"jest":"^29"}}"#)]);
        assert_eq!(jest.stack, Some(Stack::Jest));
        assert!(jest.runner.contains("jest-junit"));
        let go = layout_of(&[("go.mod", "module x\n"), ("x_test.go", "")]);
        assert_eq!(go.stack, Some(Stack::Go));
        assert!(go.runner.contains("go test -json") && go.runner.contains("go-test-json"));
        let sql = layout_of(&[("tests/t1.sql", "select 1;"), ("sql/f.sql", "")]);
        assert_eq!(sql.stack, Some(Stack::Psql));
        assert!(
            sql.runner.contains("setup = [\"sql/**/*.sql\"]"),
            "{}",
            sql.runner
        );
        assert!(
            sql.runner.contains("tests = [\"tests/**/*.sql\"]"),
            "{}",
            sql.runner
        );
        assert_eq!(layout_of(&[("README.md", "hi")]).stack, None);
    }

    #[test]
    fn test_paths_cover_every_test_the_tool_finds() {
        let node = tempdir_with(&[
            ("package.json", r#"{"devDependencies":{"jest":"29"}}"#),
            ("test/api.test.js", ""),
            ("src/components/__tests__/button.js", ""),
        ]);
        assert_eq!(
            test_paths(node.path(), Stack::Jest),
            ["test/**", "**/__tests__/**", "**/*.test.*", "**/*.spec.*"]
        );
        let only_dir = tempdir_with(&[("tests/test_a.py", ""), ("app/orders.py", "")]);
        assert_eq!(test_paths(only_dir.path(), Stack::Pytest), ["tests/**"]);
        let beside = tempdir_with(&[("tests/test_a.py", ""), ("app/test_orders.py", "")]);
        assert_eq!(
            test_paths(beside.path(), Stack::Pytest),
            ["tests/**", "**/test_*.py", "**/*_test.py"]
        );
    }

    #[test]
    fn existing_migrations_are_found_and_a_second_stack_is_named() {
        let l = layout_of(&[
            ("Cargo.toml", ""),
            ("Cargo.lock", ""),
            ("go.mod", ""),
            ("db/migrations/V1__init.sql", "create table a ();"),
            ("db/migrations/V2__more.sql", "create table b ();"),
        ]);
        assert!(
            l.migrations.contains("dir = \"db/migrations\""),
            "{}",
            l.migrations
        );
        assert!(
            l.notes
                .iter()
                .any(|n| n.contains("2 migration file(s) in db/migrations/"))
        );
        assert!(
            l.notes.iter().any(|n| n.contains("also found Go")),
            "{:?}",
            l.notes
        );
    }
}
