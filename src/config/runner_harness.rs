//! What the runner's configuration makes harness without the user listing it — the one place
//! this rule lives.
//!
//! `[paths] harness` lists what the user protects. Consort adds what `[runner]` reaches,
//! derived from the configuration's text alone (never from what is on disk, so a resumed run
//! classifies every path exactly as the run before it did):
//!
//! 1. **The files the commands name.** `runner.command` and `runner.single_test` are split into
//!    shell words as `sh` reads them: quotes and backslashes are undone, `#` starts a comment,
//!    `&&`, `||`, `;`, `|`, `&`, parentheses and newlines separate commands, `<` and `>` end a
//!    word, and the command string of `sh -c '…'` (and `bash -c`, …) is read the same way.
//!    A word names a file of the work tree when, after dropping an `--option=` or `NAME=`
//!    before it, it is a plain relative path (not absolute, no `..`; normalised, so `./x` and
//!    `x` are the same file) **and** it contains a `/`, or ends in a script or configuration
//!    extension (`.sh`, `.py`, `.js`, `.toml`, `.ini`, `.json`, `.yml`, … see
//!    [`KNOWN_EXTENSIONS`]), or stands where a script goes (the program itself, the first
//!    operand of `sh`, `bash`, `python`, `node`, `ruby`, `perl`, … and of `source` or `.`,
//!    after wrappers such as `env`, `timeout`, `nice`, `uv run`, `npx`). A word holding `$` or
//!    a backtick, `{test}`, a URL, or Go's `./...` names no file Consort can know; an unquoted
//!    `*`, `?` or `[` makes the word a glob.
//!    * A word in the test paths — a file `[paths] tests` matches, a directory holding test
//!      globs, or a glob a test glob covers ([`glob_covers`]) — is a test selection and stays
//!      the Navigator's, *unless it stands where a script goes*: a script the runner runs is
//!      harness, so a runner script inside the test paths is a configuration error
//!      ([`RunnerConfigError::ScriptInTestPaths`]).
//!    * Every other such word is harness.
//! 2. **The test tool's configuration.** A tool is detected when any word of a command (or the
//!    last component of a path word, as in `.venv/bin/pytest`) is one of its names; its files
//!    are harness at any depth (`**/name`):
//!
//! | tool | detected by | harness files (any depth, outside the test paths) |
//! |---|---|---|
//! | Python | `pytest`, `py.test`, `tox`, `nox`, `uv`, `poetry`, `pdm`, `hatch`, `pipenv` | `pyproject.toml`, `setup.cfg`, `tox.ini`, `pytest.ini`, `.pytest.ini`, `conftest.py`, `noxfile.py`, `requirements*.txt`, `uv.lock`, `poetry.lock`, `pdm.lock`, `Pipfile`, `Pipfile.lock` |
//! | Cargo | `cargo`, `cargo-nextest` | `Cargo.toml`, `Cargo.lock`, `.cargo/config.toml`, `.cargo/config`, `.config/nextest.toml`, `rust-toolchain.toml`, `rust-toolchain` |
//! | Node | `npm`, `npx`, `yarn`, `pnpm`, `bun`, `bunx`, `node`, `jest`, `vitest`, `mocha` | `package.json`, its lock files (`package-lock.json`, `npm-shrinkwrap.json`, `yarn.lock`, `pnpm-lock.yaml`, `bun.lock`, `bun.lockb`), `pnpm-workspace.yaml`, `.npmrc`, `.yarnrc`, `.yarnrc.yml`, `jest.config.*`, `vitest.config.*`, `vitest.workspace.*`, `vite.config.*`, `.mocharc*`, `babel.config.*`, `.babelrc`, `.babelrc.*`, `tsconfig.json`, `tsconfig.*.json` |
//! | Go | `go` | `go.mod`, `go.sum`, `go.work`, `go.work.sum` |
//! | Make | `make`, `gmake` | `Makefile`, `makefile`, `GNUmakefile`, `*.mk` |
//!
//!    The psql runner reads no configuration file (it runs `psql -X`): nothing is added.
//!    Decided *not* harness: code, even code that runs at build time (`build.rs`, `setup.py`):
//!    the Driver writes code, and what code does when it runs is judged by the tests.
//! 3. **The JUnit report** (`runner.junit`) is not in the tree at all: it is a plain relative
//!    path inside the run's private report directory (`$CONSORT_JUNIT`), so it adds nothing.
//!
//! The derived globs of 1 and 2 are harness *outside the test paths*
//! ([`PathPolicy::with_harness_outside_tests`]): inside them the same name is a test file. A
//! `conftest.py` under `tests/` is the Navigator's, written in RED and frozen once accepted like
//! any test file; a `conftest.py` anywhere else, the root `pyproject.toml` or `Cargo.toml`,
//! belongs to no agent.
//!
//! Loading the configuration also refuses (see [`check_runner`]) psql test globs
//! (`runner.tests`) that `[paths] tests` does not cover, so no file the Navigator may not write
//! can be run as a test.
//!
//! A dependency manifest that is also the tool's configuration (`pyproject.toml`, `Cargo.toml`,
//! `package.json` and their lock files) is therefore harness: a change set that touches it is
//! refused as `TouchesHarness` naming the file, whose message tells the agent that a new
//! dependency is a human's change. The guide ("Runners and suites", "Dependencies") says how a human adds one.

use std::fmt;

use consort_actors::PathPolicy;
use consort_actors::{PathError, check_glob, glob_covers, literal_glob, normalise_relative};

use crate::config::runner::RunnerConfig;

/// File extensions that make a word without a `/` name a file (scripts and configuration).
pub const KNOWN_EXTENSIONS: [&str; 33] = [
    "sh", "bash", "zsh", "ksh", "dash", "fish", "bats", "py", "rb", "pl", "pm", "php", "js", "mjs",
    "cjs", "ts", "mts", "cts", "lua", "tcl", "r", "ps1", "toml", "ini", "cfg", "conf", "json",
    "jsonc", "yaml", "yml", "xml", "sql", "mk",
];

/// A test tool detected from the words of the runner's commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum Tool {
    /// pytest and the Python project tools around it.
    Python,
    /// cargo test and cargo nextest.
    Cargo,
    /// npm, yarn, pnpm, bun with jest, vitest, mocha or node's own runner.
    Node,
    /// go test.
    Go,
    /// make.
    Make,
}

impl Tool {
    /// Every tool, in table order.
    pub const ALL: [Tool; 5] = [Tool::Python, Tool::Cargo, Tool::Node, Tool::Go, Tool::Make];

    /// The tool's name, for people.
    pub fn name(self) -> &'static str {
        match self {
            Tool::Python => "Python",
            Tool::Cargo => "Cargo",
            Tool::Node => "Node",
            Tool::Go => "Go",
            Tool::Make => "Make",
        }
    }

    /// The command words that detect it.
    pub fn words(self) -> &'static [&'static str] {
        match self {
            Tool::Python => &[
                "pytest", "py.test", "tox", "nox", "uv", "poetry", "pdm", "hatch", "pipenv",
            ],
            Tool::Cargo => &["cargo", "cargo-nextest"],
            Tool::Node => &[
                "npm", "npx", "yarn", "pnpm", "bun", "bunx", "node", "jest", "vitest", "mocha",
            ],
            Tool::Go => &["go"],
            Tool::Make => &["make", "gmake"],
        }
    }

    /// The files (glob file names) that change how it collects or judges tests.
    pub fn files(self) -> &'static [&'static str] {
        match self {
            Tool::Python => &[
                "pyproject.toml",
                "setup.cfg",
                "tox.ini",
                "pytest.ini",
                ".pytest.ini",
                "conftest.py",
                "noxfile.py",
                "requirements*.txt",
                "uv.lock",
                "poetry.lock",
                "pdm.lock",
                "Pipfile",
                "Pipfile.lock",
            ],
            Tool::Cargo => &[
                "Cargo.toml",
                "Cargo.lock",
                ".cargo/config.toml",
                ".cargo/config",
                ".config/nextest.toml",
                "rust-toolchain.toml",
                "rust-toolchain",
            ],
            Tool::Node => &[
                "package.json",
                "package-lock.json",
                "npm-shrinkwrap.json",
                "yarn.lock",
                "pnpm-lock.yaml",
                "pnpm-workspace.yaml",
                "bun.lock",
                "bun.lockb",
                ".npmrc",
                ".yarnrc",
                ".yarnrc.yml",
                "jest.config.*",
                "vitest.config.*",
                "vitest.workspace.*",
                "vite.config.*",
                ".mocharc*",
                "babel.config.*",
                ".babelrc",
                ".babelrc.*",
                "tsconfig.json",
                "tsconfig.*.json",
            ],
            Tool::Go => &["go.mod", "go.sum", "go.work", "go.work.sum"],
            Tool::Make => &["Makefile", "makefile", "GNUmakefile", "*.mk"],
        }
    }

    /// Its harness globs: each file at any depth.
    pub fn globs(self) -> impl Iterator<Item = String> {
        self.files().iter().map(|f| format!("**/{f}"))
    }
}

impl fmt::Display for Tool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A file (or shell glob) a runner command names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedFile {
    /// The configuration key of the command (`runner.command` or `runner.single_test`).
    pub key: &'static str,
    /// The path as it reaches into the work tree, normalised (`./run.sh` is `run.sh`); for a
    /// word that holds an expansion, the word as written.
    pub path: String,
    /// The word is an unquoted shell pattern (`scripts/*.sh`).
    pub pattern: bool,
    /// The word stands where a script goes (it is run, not read).
    pub script: bool,
}

impl NamedFile {
    /// The harness globs for it: the exact path, and for a pattern the pattern too (when it
    /// compiles) — `sh` runs what the pattern matches, or the word itself when it matches
    /// nothing.
    pub fn globs(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.pattern && check_glob(&self.path).is_ok() {
            out.push(self.path.clone());
        }
        out.push(literal_glob(&self.path));
        out
    }
}

/// What the runner's configuration makes harness (see the module documentation).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunnerHarness {
    /// Files the commands name, outside the test paths.
    pub files: Vec<NamedFile>,
    /// The tools detected, in table order, without repeats.
    pub tools: Vec<Tool>,
    /// Scripts the commands run that lie in the test paths: a configuration error.
    pub scripts_in_tests: Vec<NamedFile>,
    /// Scripts behind an expansion Consort cannot follow (`sh "$SCRIPT"`): protected only when
    /// `[paths] harness` lists them.
    pub unseen: Vec<NamedFile>,
}

impl RunnerHarness {
    /// What `runner` makes harness, given the test paths of `tests`.
    pub fn of(runner: &RunnerConfig, tests: &PathPolicy) -> Self {
        let mut out = RunnerHarness::default();
        let RunnerConfig::Command {
            command,
            single_test,
            ..
        } = runner
        else {
            return out;
        };
        let mut scan = Scanner {
            tests,
            out: &mut out,
            key: "runner.command",
        };
        scan.line(command, 0);
        if let Some(single) = single_test {
            scan.key = "runner.single_test";
            scan.line(single, 0);
        }
        out.tools.sort();
        out.tools.dedup();
        let mut seen = std::collections::BTreeSet::new();
        out.files
            .retain(|f| seen.insert((f.path.clone(), f.pattern)));
        out
    }

    /// The harness globs that yield to the test paths: the named files' and the tools'.
    pub fn outside_test_globs(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        let all = self
            .files
            .iter()
            .flat_map(NamedFile::globs)
            .chain(self.tools.iter().flat_map(|t| t.globs()));
        for g in all {
            if !out.contains(&g) {
                out.push(g);
            }
        }
        out
    }

    /// What it protects, one line each, for people (`consort doctor`).
    pub fn describe(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for f in &self.files {
            let what = if f.pattern { "files matching" } else { "" };
            let how = if f.script { "run by" } else { "named by" };
            lines.push(
                format!("{what} {} ({how} {})", f.path, f.key)
                    .trim()
                    .to_string(),
            );
        }
        for t in &self.tools {
            lines.push(format!(
                "{t} configuration, at any depth outside the test paths: {}",
                t.files().join(", ")
            ));
        }
        lines
    }
}

/// Why the runner's configuration is refused against the test paths.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum RunnerConfigError {
    /// A command runs a script that lies in the test paths, where the Navigator could write it.
    #[error(
        "runs {path}, which `paths.tests` classifies as a test path; a script the runner runs is harness, so it must live outside the test paths (move it, or narrow `paths.tests`)"
    )]
    ScriptInTestPaths {
        /// `runner.command` or `runner.single_test`.
        key: &'static str,
        /// The script, normalised.
        path: String,
    },
    /// The JUnit report is not a plain relative path (it names a file in the run's report
    /// directory).
    #[error(
        "{path} is not a plain relative path (no `..`, not absolute); the report is a file in the run's report directory ($CONSORT_REPORT_DIR)"
    )]
    ReportOutsideWorkTree {
        /// The report as configured.
        path: String,
        /// Why.
        #[source]
        reason: PathError,
    },
    /// A psql test glob names files the test paths do not cover.
    #[error(
        "glob \"{glob}\" is not covered by `paths.tests` ({tests}); every runner test glob must equal a `paths.tests` glob or narrow one (`L/**` covers globs that start with `L/`, `**/S` and `L/**/S` cover globs that end with `/S`), or a file the Driver writes could be run as a test"
    )]
    TestGlobNotCovered {
        /// The runner's glob.
        glob: String,
        /// The test-path globs, quoted and joined.
        tests: String,
    },
}

impl RunnerConfigError {
    /// The configuration key at fault.
    pub fn key(&self) -> &'static str {
        match self {
            RunnerConfigError::ScriptInTestPaths { key, .. } => key,
            RunnerConfigError::ReportOutsideWorkTree { .. } => "runner.junit",
            RunnerConfigError::TestGlobNotCovered { .. } => "runner.tests",
        }
    }
}

/// Checks `runner` against the test paths of `tests`: a plain report path, and every psql test
/// glob covered by a test-path glob ([`glob_covers`]).
pub fn check_runner(runner: &RunnerConfig, tests: &PathPolicy) -> Result<(), RunnerConfigError> {
    match runner {
        RunnerConfig::Psql { tests: globs, .. } => {
            for glob in globs {
                if !tests.test_globs().iter().any(|t| glob_covers(t, glob)) {
                    let quoted: Vec<String> = tests
                        .test_globs()
                        .iter()
                        .map(|t| format!("\"{t}\""))
                        .collect();
                    return Err(RunnerConfigError::TestGlobNotCovered {
                        glob: glob.clone(),
                        tests: quoted.join(", "),
                    });
                }
            }
            Ok(())
        }
        RunnerConfig::Command { junit, .. } => {
            if let Some(j) = junit {
                let written = j.to_string_lossy();
                normalise_relative(&written).map_err(|reason| {
                    RunnerConfigError::ReportOutsideWorkTree {
                        path: written.to_string(),
                        reason,
                    }
                })?;
            }
            let harness = RunnerHarness::of(runner, tests);
            match harness.scripts_in_tests.into_iter().next() {
                Some(f) => Err(RunnerConfigError::ScriptInTestPaths {
                    key: f.key,
                    path: f.path,
                }),
                None => Ok(()),
            }
        }
    }
}

/// One shell word, with its quotes undone.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Word {
    /// The text.
    pub text: String,
    /// It holds an expansion (`$`, a backtick) whose value Consort cannot know.
    pub dynamic: bool,
    /// It holds an unquoted `*`, `?` or `[`: a pattern the shell expands.
    pub pattern: bool,
}

/// Splits a command line into simple commands, each a list of words, as `sh` reads it — enough
/// to find the files it names, not a whole shell (no aliases, functions or here-documents).
pub fn simple_commands(line: &str) -> Vec<Vec<Word>> {
    Lexer {
        chars: line.chars().peekable(),
        commands: Vec::new(),
        current: Vec::new(),
        word: None,
    }
    .run()
}

struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    commands: Vec<Vec<Word>>,
    current: Vec<Word>,
    word: Option<Word>,
}

impl Lexer<'_> {
    fn mark(&mut self) -> &mut Word {
        self.word.get_or_insert_with(Word::default)
    }

    fn push(&mut self, c: char) {
        self.mark().text.push(c);
    }

    fn end_word(&mut self) {
        if let Some(w) = self.word.take() {
            self.current.push(w);
        }
    }

    fn end_command(&mut self) {
        self.end_word();
        if !self.current.is_empty() {
            self.commands.push(std::mem::take(&mut self.current));
        }
    }

    fn run(mut self) -> Vec<Vec<Word>> {
        while let Some(c) = self.chars.next() {
            match c {
                ' ' | '\t' | '\r' => self.end_word(),
                '\n' | ';' | '(' | ')' => self.end_command(),
                '&' | '|' => {
                    self.end_command();
                    if self.chars.peek() == Some(&c) {
                        self.chars.next();
                    }
                }
                '<' | '>' => {
                    self.end_word();
                    while matches!(self.chars.peek(), Some('>' | '&' | '|')) {
                        self.chars.next();
                    }
                }
                '#' if self.word.is_none() => {
                    for c in self.chars.by_ref() {
                        if c == '\n' {
                            break;
                        }
                    }
                    self.end_command();
                }
                '\'' => {
                    self.mark();
                    for c in self.chars.by_ref() {
                        if c == '\'' {
                            break;
                        }
                        self.word.get_or_insert_with(Word::default).text.push(c);
                    }
                }
                '"' => self.double_quoted(),
                '\\' => match self.chars.next() {
                    Some('\n') | None => {}
                    Some(c) => self.push(c),
                },
                '$' | '`' => self.expansion(c),
                '*' | '?' | '[' => {
                    self.mark().pattern = true;
                    self.push(c);
                }
                c => self.push(c),
            }
        }
        self.end_command();
        self.commands
    }

    fn double_quoted(&mut self) {
        self.mark();
        while let Some(c) = self.chars.next() {
            match c {
                '"' => return,
                '\\' => match self.chars.peek().copied() {
                    Some(n @ ('$' | '`' | '"' | '\\')) => {
                        self.chars.next();
                        self.push(n);
                    }
                    Some('\n') => {
                        self.chars.next();
                    }
                    _ => self.push('\\'),
                },
                '$' | '`' => self.expansion(c),
                c => self.push(c),
            }
        }
    }

    /// `$NAME`, `${…}`, `$(…)` or a backtick substitution: the word becomes dynamic, and a
    /// bracketed expansion is taken whole so its insides split nothing.
    fn expansion(&mut self, c: char) {
        self.mark().dynamic = true;
        self.push(c);
        let (open, close) = match (c, self.chars.peek()) {
            ('`', _) => ('`', '`'),
            ('$', Some('(')) => ('(', ')'),
            ('$', Some('{')) => ('{', '}'),
            _ => return,
        };
        if c == '$' {
            self.chars.next();
            self.push(open);
        }
        let mut depth = 1u32;
        while let Some(n) = self.chars.next() {
            self.push(n);
            if n == close {
                depth -= 1;
                if depth == 0 {
                    return;
                }
            } else if n == open {
                depth += 1;
            }
        }
    }
}

/// Programs that run the program after them (their options, and `NAME=value`, skipped).
const WRAPPERS: [&str; 16] = [
    "env", "exec", "command", "builtin", "time", "nice", "nohup", "timeout", "stdbuf", "xvfb-run",
    "sudo", "doas", "npx", "bunx", "unbuffer", "chronic",
];

/// Wrapper options that take the next word as their value.
const WRAPPER_VALUE_OPTIONS: [&str; 11] = [
    "-n",
    "-u",
    "-s",
    "-k",
    "-C",
    "-g",
    "--signal",
    "--kill-after",
    "--user",
    "--group",
    "--chdir",
];

/// Two-word wrappers: the tool, then the subcommand that runs a program.
const TWO_WORD_WRAPPERS: [(&str, &str); 10] = [
    ("uv", "run"),
    ("poetry", "run"),
    ("pipenv", "run"),
    ("pdm", "run"),
    ("hatch", "run"),
    ("rye", "run"),
    ("pnpm", "exec"),
    ("pnpm", "dlx"),
    ("npm", "exec"),
    ("yarn", "exec"),
];

/// How a program takes a script as its first operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Interpreter {
    Shell,
    Python,
    Node,
    Other,
    Source,
}

fn interpreter(program: &str) -> Option<Interpreter> {
    let python = |p: &str| {
        ["python", "pypy"].iter().any(|n| {
            p.strip_prefix(n)
                .is_some_and(|v| v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        })
    };
    Some(match program {
        "sh" | "bash" | "dash" | "zsh" | "ksh" | "mksh" | "ash" => Interpreter::Shell,
        "node" | "nodejs" => Interpreter::Node,
        "ruby" | "perl" | "php" | "lua" | "Rscript" | "tclsh" => Interpreter::Other,
        "source" | "." => Interpreter::Source,
        p if python(p) => Interpreter::Python,
        _ => return None,
    })
}

/// What an interpreter's option does to the words after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Effect {
    /// A flag.
    Flag,
    /// The next word is its value (read as an ordinary operand).
    Value,
    /// The next word is code; there is no script.
    Code,
    /// The next word is a module name; there is no script (`python -m pytest`).
    Module,
    /// The next word is a command line (`sh -c`); there is no script.
    Command,
    /// There is no script (`node --test`).
    NoScript,
}

fn option_effect(interp: Interpreter, opt: &str) -> Effect {
    match interp {
        Interpreter::Shell => match opt {
            "--rcfile" | "--init-file" | "-o" | "+o" | "-O" | "+O" => Effect::Value,
            o if !o.starts_with("--") && o[1..].contains('c') => Effect::Command,
            _ => Effect::Flag,
        },
        Interpreter::Python => match opt {
            "-m" => Effect::Module,
            "-c" => Effect::Code,
            "-W" | "-X" => Effect::Value,
            _ => Effect::Flag,
        },
        Interpreter::Node => match opt {
            "-e" | "--eval" | "-p" | "--print" => Effect::Code,
            "--test" => Effect::NoScript,
            "-r"
            | "--require"
            | "--import"
            | "--loader"
            | "--experimental-loader"
            | "--env-file"
            | "-C"
            | "--conditions" => Effect::Value,
            _ => Effect::Flag,
        },
        Interpreter::Other => match opt {
            "-e" | "-E" => Effect::Code,
            "-r" | "-I" => Effect::Value,
            _ => Effect::Flag,
        },
        Interpreter::Source => Effect::Flag,
    }
}

/// How deep `sh -c '…'` strings are read.
const MAX_NESTING: u8 = 3;

/// Where a word stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Operand,
    Script,
}

struct Scanner<'a> {
    tests: &'a PathPolicy,
    out: &'a mut RunnerHarness,
    key: &'static str,
}

impl Scanner<'_> {
    fn line(&mut self, line: &str, depth: u8) {
        for words in simple_commands(line) {
            self.command(&words, depth);
        }
    }

    fn command(&mut self, words: &[Word], depth: u8) {
        for w in words.iter().filter(|w| !w.dynamic) {
            let name = w.text.rsplit('/').next().unwrap_or_default();
            for tool in Tool::ALL {
                if tool.words().contains(&name) {
                    self.out.tools.push(tool);
                }
            }
        }
        let start = program_index(words);
        for w in &words[..start] {
            self.word(w, Place::Operand);
        }
        let Some(program) = words.get(start) else {
            return;
        };
        let place = if program.text.contains('/') || program.dynamic {
            Place::Script
        } else {
            Place::Operand
        };
        self.word(program, place);
        let name = program.text.rsplit('/').next().unwrap_or_default();
        self.operands(interpreter(name), &words[start + 1..], depth);
    }

    fn operands(&mut self, interp: Option<Interpreter>, rest: &[Word], depth: u8) {
        let mut script_slot = interp;
        let mut k = 0;
        while let Some(w) = rest.get(k) {
            let t = w.text.as_str();
            let is_option = t.len() > 1
                && (t.starts_with('-')
                    || (t.starts_with('+') && interp == Some(Interpreter::Shell)));
            match script_slot {
                Some(i) if is_option && !w.dynamic => {
                    self.word(w, Place::Operand);
                    let next = rest.get(k + 1);
                    match option_effect(i, t) {
                        Effect::Flag => {}
                        Effect::NoScript => script_slot = None,
                        Effect::Value => {
                            if let Some(v) = next {
                                self.word(v, Place::Operand);
                            }
                            k += 1;
                        }
                        Effect::Code | Effect::Module => {
                            script_slot = None;
                            k += 1;
                        }
                        Effect::Command => {
                            if let Some(c) = next.filter(|c| !c.dynamic && depth < MAX_NESTING) {
                                self.line(&c.text, depth + 1);
                            }
                            script_slot = None;
                            k += 1;
                        }
                    }
                }
                Some(_) => {
                    self.word(w, Place::Script);
                    script_slot = None;
                }
                None => self.word(w, Place::Operand),
            }
            k += 1;
        }
    }

    fn word(&mut self, w: &Word, place: Place) {
        let script = place == Place::Script;
        if w.dynamic {
            if script {
                self.out.unseen.push(NamedFile {
                    key: self.key,
                    path: w.text.clone(),
                    pattern: false,
                    script,
                });
            }
            return;
        }
        let Some(text) = file_text(&w.text) else {
            return;
        };
        let Ok(path) = normalise_relative(text) else {
            return;
        };
        if path.rsplit('/').next() == Some("...") {
            return;
        }
        if !(script || text.contains('/') || has_known_extension(&path)) {
            return;
        }
        let file = NamedFile {
            key: self.key,
            path,
            pattern: w.pattern,
            script,
        };
        match self.in_tests(&file) {
            InTests::No => self.out.files.push(file),
            InTests::File if script => self.out.scripts_in_tests.push(file),
            InTests::File | InTests::Directory => {}
        }
    }

    fn in_tests(&self, file: &NamedFile) -> InTests {
        let globs = self.tests.test_globs();
        if file.pattern {
            if globs.iter().any(|t| glob_covers(t, &file.path)) {
                return InTests::File;
            }
            return InTests::No;
        }
        if self.tests.is_test(&file.path) {
            return InTests::File;
        }
        let under = format!("{}/**", literal_glob(&file.path));
        if globs.iter().any(|t| glob_covers(&under, t)) {
            return InTests::Directory;
        }
        InTests::No
    }
}

/// Whether a named path is in the test paths.
enum InTests {
    No,
    File,
    Directory,
}

/// The index of the program word: past `NAME=value` assignments and wrappers (at most the
/// number of words).
fn program_index(words: &[Word]) -> usize {
    let mut i = 0;
    loop {
        while words.get(i).is_some_and(|w| is_assignment(&w.text)) {
            i += 1;
        }
        let Some(w) = words.get(i) else {
            return i.min(words.len());
        };
        let name = w.text.rsplit('/').next().unwrap_or_default();
        if WRAPPERS.contains(&name) {
            i += 1;
            while let Some(o) = words.get(i)
                && ((o.text.len() > 1 && o.text.starts_with('-')) || is_assignment(&o.text))
            {
                i += if WRAPPER_VALUE_OPTIONS.contains(&o.text.as_str()) {
                    2
                } else {
                    1
                };
            }
            if name == "timeout" {
                i += 1;
            }
            continue;
        }
        let two_word = TWO_WORD_WRAPPERS
            .iter()
            .any(|(tool, sub)| name == *tool && words.get(i + 1).is_some_and(|n| n.text == *sub));
        if two_word {
            i += 2;
            continue;
        }
        return i;
    }
}

/// Whether `word` is a `NAME=value` assignment as `sh` reads one.
pub fn is_assignment(word: &str) -> bool {
    word.split_once('=').is_some_and(|(name, _)| is_name(name))
}

fn is_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The part of a word that could name a file: after `--option=` or `NAME=`; `None` for an
/// option without a value, `{test}`, a URL.
fn file_text(word: &str) -> Option<&str> {
    let text = if word.starts_with('-') {
        word.split_once('=')?.1
    } else {
        match word.split_once('=') {
            Some((name, value)) if is_name(name) => value,
            _ => word,
        }
    };
    if text.is_empty() || text.contains("{test}") || text.contains("://") {
        return None;
    }
    Some(text)
}

fn has_known_extension(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or_default();
    name.rsplit_once('.').is_some_and(|(_, ext)| {
        KNOWN_EXTENSIONS
            .iter()
            .any(|known| known.eq_ignore_ascii_case(ext))
    })
}

#[cfg(test)]
mod tests;
