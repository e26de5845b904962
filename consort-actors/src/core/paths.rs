//! Which paths are tests, which are the harness, and which are not paths at all.
//!
//! This is the pure half of path safety: lexical checks, glob classification and the names of
//! the directories that are never hashed ([`TreeFilter`]), used by the state machine. The
//! file-system half (symlinks, what the OS accepts) lives in [`crate::worktree`].
//!
//! Globs are `globset` globs with its defaults: they match the whole normalised relative path,
//! `*` and `?` also match `/`, `dir/**` matches everything under `dir/` (not `dir` itself) and
//! `**/name` matches `name` at any depth.

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

/// Globs that are always part of the harness: Consort's own files, and version-control
/// metadata at any depth (hooks and configuration run code outside any test run).
pub(crate) const ALWAYS_HARNESS: [&str; 9] = [
    "consort.toml",
    ".consort",
    ".consort/**",
    "**/.git",
    "**/.git/**",
    "**/.hg",
    "**/.hg/**",
    "**/.svn",
    "**/.svn/**",
];

/// Directory names that test runners and build tools fill with caches and build output. A
/// directory of one of these names, at any depth, is never hashed, never listed and never taken
/// for test files; [`TreeFilter`] adds the project's own names (`[paths] caches`).
pub const DEFAULT_CACHES: [&str; 13] = [
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    ".tox",
    ".nox",
    ".venv",
    "target",
    "node_modules",
    ".gradle",
    ".next",
    ".turbo",
];

/// Directories of installed dependencies ([`DEFAULT_CACHES`] too, so never hashed), each with
/// the caches test tools keep inside it. A dependency directory is read-only to a confined
/// run, since the test tools that judge the run live there (a run that could rewrite
/// `node_modules/vitest` or `.venv/…/pytest` could make every later run report a pass); only
/// the caches named here are writable, made before the run when missing. Lanes link the
/// project's own into their workspace.
pub const DEPENDENCY_DIRS: [(&str, &[&str]); 2] = [
    (
        "node_modules",
        &[".vite", ".vite-temp", ".vitest", ".cache"],
    ),
    (".venv", &[]),
];

/// The caches test tools keep inside dependency directory `name`, when it is one.
pub fn dependency_caches(name: &str) -> Option<&'static [&'static str]> {
    DEPENDENCY_DIRS
        .iter()
        .find(|(dir, _)| *dir == name)
        .map(|(_, caches)| *caches)
}

/// Version-control metadata directories: never hashed, and part of the harness at any depth.
pub(crate) const VCS_DIRS: [&str; 3] = [".git", ".hg", ".svn"];

/// Consort's own state directory: never hashed (at any depth), and part of the harness at the top.
pub const STATE_DIR: &str = ".consort";

/// The longest file name (one path component, in bytes) the work tree accepts: the common
/// `NAME_MAX` of Linux and macOS file systems.
pub(crate) const MAX_NAME_BYTES: usize = 255;

/// Why a path is refused before any file is touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum PathError {
    /// Empty, or only dots and slashes.
    #[error("empty path")]
    Empty,
    /// Starts at the root (`/x`) or a drive.
    #[error("absolute path `{path}` is outside the work tree")]
    Absolute {
        /// The path.
        path: String,
    },
    /// Contains a `..` component.
    #[error("path `{path}` climbs out of the work tree")]
    ParentComponent {
        /// The path.
        path: String,
    },
    /// Contains a NUL byte, a backslash or a control character.
    #[error("path `{path}` contains a forbidden character")]
    BadCharacter {
        /// The path (control characters escaped).
        path: String,
    },
    /// Longer than 1024 bytes.
    #[error("path is too long ({len} bytes; at most 1024)")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// Resolves (through a symlink) to somewhere outside the work tree.
    #[error("path `{path}` resolves outside the work tree")]
    EscapesThroughLink {
        /// The path.
        path: String,
    },
}

/// Why the file system cannot take a change at a path. Found before anything is written when it
/// can be; otherwise reported by the OS mid-way, after which the change set is rolled back. Either
/// way nothing of the change set stays applied, and the agent may try again.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "kebab-case")]
#[non_exhaustive]
pub enum WriteProblem {
    /// A path component is longer than the file system allows.
    #[error("a path component is {len} bytes long; at most {max}")]
    NameTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit (`MAX_NAME_BYTES`).
        max: usize,
    },
    /// A component that would have to be a directory is an existing file.
    #[error("{path} is a file, not a directory")]
    NotADirectory {
        /// The file in the way (relative to the work tree when known).
        path: String,
    },
    /// The path names an existing directory, not a file.
    #[error("{path} is a directory, not a file")]
    IsADirectory {
        /// The directory (relative to the work tree).
        path: String,
    },
    /// The file to overwrite or delete is not UTF-8 text, so its undo cannot be recorded.
    #[error("{path} is not UTF-8 text; its undo cannot be recorded")]
    NotText {
        /// The file (relative to the work tree).
        path: String,
    },
    /// A restore of raw bytes whose hex does not decode.
    #[error("the bytes to restore at {path} are not hex")]
    MalformedRestore {
        /// The file (relative to the work tree).
        path: String,
    },
    /// The operating system refused the operation for this path.
    #[error("the file system refused to {op} it: {detail}")]
    Refused {
        /// What was being done (`write`, `create directory`, `delete`, …).
        op: String,
        /// The OS's words.
        detail: String,
    },
}

/// Checks that `path` is a plain relative path inside the work tree, lexically.
///
/// Returns the normalised form (no `.` components, single slashes).
pub fn normalise_relative(path: &str) -> Result<String, PathError> {
    if path.len() > 1024 {
        return Err(PathError::TooLong { len: path.len() });
    }
    if path
        .chars()
        .any(|c| c == '\0' || c == '\\' || c.is_control())
    {
        return Err(PathError::BadCharacter {
            path: path.escape_default().to_string(),
        });
    }
    if path.starts_with('/') || path.starts_with('~') || path.get(1..2) == Some(":") {
        return Err(PathError::Absolute {
            path: path.to_string(),
        });
    }
    let mut parts = Vec::new();
    for comp in path.split('/') {
        match comp {
            "" | "." => continue,
            ".." => {
                return Err(PathError::ParentComponent {
                    path: path.to_string(),
                });
            }
            c => parts.push(c),
        }
    }
    if parts.is_empty() {
        return Err(PathError::Empty);
    }
    Ok(parts.join("/"))
}

/// A glob that does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad glob `{glob}`: {detail}")]
pub struct GlobError {
    /// The glob.
    pub glob: String,
    /// The parser's complaint.
    pub detail: String,
}

/// A cache directory name that cannot name a directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad cache directory name `{name}`: {detail}")]
pub struct CacheNameError {
    /// The name.
    pub name: String,
    /// What is wrong with it.
    pub detail: String,
}

/// The directories whose contents are never hashed, never listed, never handed to an agent and
/// never taken for test files, matched by name at any depth: [`DEFAULT_CACHES`], `VCS_DIRS`,
/// [`STATE_DIR`], and the project's extra cache names (`[paths] caches`).
///
/// One definition for everyone who hashes or lists a work tree: the conductor's
/// [`crate::worktree::WorkTree`], the verifier (through [`crate::core::protocol::VerifyRequest`]), the
/// psql runner and the external-command agent. Since no receipt covers these directories, the
/// state machine refuses any change set that writes into one
/// ([`crate::core::machine::RuleViolation::TouchesUnhashed`]).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TreeFilter {
    extra: Vec<String>,
}

impl TreeFilter {
    /// The defaults plus `extra` names (duplicates and names already in the defaults dropped).
    /// A name is matched against whole directory names; one that cannot be a directory name
    /// (see [`TreeFilter::check_name`]) simply never matches.
    pub fn new<S: AsRef<str>>(extra: &[S]) -> Self {
        let mut names: Vec<String> = Vec::new();
        for name in extra {
            let name = name.as_ref();
            if !Self::is_default(name) && !names.iter().any(|n| n == name) {
                names.push(name.to_string());
            }
        }
        TreeFilter { extra: names }
    }

    /// Whether `name` is a valid extra cache name: one non-empty directory name, not `.` or `..`,
    /// without a slash, a backslash or a control character.
    pub fn check_name(name: &str) -> Result<(), CacheNameError> {
        let bad = |detail: &str| CacheNameError {
            name: name.escape_default().to_string(),
            detail: detail.into(),
        };
        if name.is_empty() || name == "." || name == ".." {
            return Err(bad("name a directory"));
        }
        if name.contains('/') || name.contains('\\') {
            return Err(bad(
                "a directory name, not a path (it matches at any depth)",
            ));
        }
        if name.chars().any(|c| c.is_control()) {
            return Err(bad("contains a control character"));
        }
        if name.len() > MAX_NAME_BYTES {
            return Err(bad("longer than a file name may be"));
        }
        Ok(())
    }

    fn is_default(name: &str) -> bool {
        DEFAULT_CACHES.contains(&name) || VCS_DIRS.contains(&name) || name == STATE_DIR
    }

    /// The extra names, beyond the defaults.
    pub fn extra(&self) -> &[String] {
        &self.extra
    }

    /// Whether a directory called `name` is a cache (a default or an extra name), which a
    /// confined test run may write; version control and Consort's state are skipped but are
    /// no caches.
    pub fn is_cache(&self, name: &str) -> bool {
        DEFAULT_CACHES.contains(&name) || self.extra.iter().any(|n| n == name)
    }

    /// Whether a directory called `name` is skipped, wherever it is.
    pub fn skips(&self, name: &str) -> bool {
        Self::is_default(name) || self.extra.iter().any(|n| n == name)
    }

    /// The first directory component of `path` (normalised, relative; its last component is the
    /// file itself) that is skipped, if any: `Some("__pycache__")` for
    /// `tests/__pycache__/t1.pyc`.
    pub fn skipped_dir<'a>(&self, path: &'a str) -> Option<&'a str> {
        let mut dirs: Vec<&str> = path.split('/').collect();
        dirs.pop();
        dirs.into_iter().find(|d| self.skips(d))
    }
}

/// Classifies work-tree paths as test paths and harness paths.
///
/// Test paths are the Navigator's alone (and only in RED). Harness paths — Consort's own files,
/// version-control metadata and the runner's configuration and scripts — belong to no agent.
/// Paths inside a directory the [`TreeFilter`] skips are never test paths.
///
/// There are two kinds of harness glob. Plain harness globs ([`PathPolicy::new`]) win over the
/// test globs: a path they match is harness even inside the test paths. Harness globs *outside
/// the tests* ([`PathPolicy::with_harness_outside_tests`]) yield to them: a path they match is
/// harness only when no test glob matches it too, so a test tool's configuration file inside
/// the test paths (a `conftest.py` under `tests/`) stays a test file — the Navigator's in RED,
/// frozen once accepted — while the same file anywhere else belongs to no agent.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    test_globs: Vec<String>,
    harness_globs: Vec<String>,
    outside_test_globs: Vec<String>,
    tests: GlobSet,
    harness: GlobSet,
    outside_tests: GlobSet,
    filter: TreeFilter,
    collected: Option<(Vec<String>, GlobSet)>,
    identity: crate::TestIdentity,
}

impl PathPolicy {
    /// A policy from test-path globs and extra harness globs (Consort's own files are always
    /// harness).
    pub fn new<S: AsRef<str>>(test_globs: &[S], harness_globs: &[S]) -> Result<Self, GlobError> {
        let test_globs: Vec<String> = test_globs.iter().map(|g| g.as_ref().to_string()).collect();
        let mut harness: Vec<String> = ALWAYS_HARNESS.iter().map(|s| s.to_string()).collect();
        harness.extend(harness_globs.iter().map(|g| g.as_ref().to_string()));
        harness.dedup();
        Ok(PathPolicy {
            tests: build_set(&test_globs)?,
            harness: build_set(&harness)?,
            outside_tests: GlobSet::empty(),
            test_globs,
            harness_globs: harness,
            outside_test_globs: Vec::new(),
            filter: TreeFilter::default(),
            collected: None,
            identity: crate::TestIdentity::default(),
        })
    }

    /// The same policy, knowing how the runner names the tests it reports.
    pub fn with_test_identity(mut self, identity: crate::TestIdentity) -> Self {
        self.identity = identity;
        self
    }

    /// How the runner names the tests it reports.
    pub fn test_identity(&self) -> crate::TestIdentity {
        self.identity
    }

    /// The same policy knowing which files the test runner collects as tests (for example
    /// pytest's `**/test_*.py`): a test-list entry elsewhere would never run, so
    /// [`crate::check_test_list`] refuses it. Without it, every test path counts as collected.
    pub fn with_collected<S: AsRef<str>>(mut self, globs: &[S]) -> Result<Self, GlobError> {
        let globs: Vec<String> = globs.iter().map(|g| g.as_ref().to_string()).collect();
        let set = build_set(&globs)?;
        self.collected = Some((globs, set));
        Ok(self)
    }

    /// Whether the runner collects `path` as a test file (always, when the policy was not told
    /// what the runner collects).
    pub fn is_collected(&self, path: &str) -> bool {
        self.collected
            .as_ref()
            .is_none_or(|(_, set)| set.is_match(path))
    }

    /// The globs of the files the runner collects as tests, when known.
    pub fn collected_globs(&self) -> Option<&[String]> {
        self.collected.as_ref().map(|(g, _)| g.as_slice())
    }

    /// The policy as plain data, for an agent to check its own answer with the same rules
    /// ([`PathRules::policy`] rebuilds it).
    pub fn rules(&self) -> PathRules {
        PathRules {
            tests: self.test_globs.clone(),
            harness: self
                .harness_globs
                .iter()
                .filter(|g| !ALWAYS_HARNESS.contains(&g.as_str()))
                .cloned()
                .collect(),
            harness_outside_tests: self.outside_test_globs.clone(),
            caches: self.filter.extra().to_vec(),
            collected: self.collected_globs().map(<[String]>::to_vec),
            test_identity: self.identity,
        }
    }

    /// Adds harness globs that yield to the test paths: a path they match is harness unless a
    /// test glob matches it too (see the type's documentation).
    pub fn with_harness_outside_tests<S: AsRef<str>>(
        mut self,
        globs: &[S],
    ) -> Result<Self, GlobError> {
        for g in globs {
            let g = g.as_ref().to_string();
            if !self.outside_test_globs.contains(&g) {
                self.outside_test_globs.push(g);
            }
        }
        self.outside_tests = build_set(&self.outside_test_globs)?;
        Ok(self)
    }

    /// The same policy with the project's extra cache directory names (added to the defaults).
    pub fn with_caches<S: AsRef<str>>(mut self, extra: &[S]) -> Self {
        self.filter = TreeFilter::new(extra);
        self
    }

    /// The directories never hashed, listed or taken for test files.
    pub fn tree_filter(&self) -> &TreeFilter {
        &self.filter
    }

    /// Whether `path` (normalised, relative) is a test path: it matches a test glob and does not
    /// lie in a directory the [`TreeFilter`] skips.
    pub fn is_test(&self, path: &str) -> bool {
        self.tests.is_match(path) && self.filter.skipped_dir(path).is_none()
    }

    /// Whether `path` (normalised, relative) is part of the harness.
    pub fn is_harness(&self, path: &str) -> bool {
        self.harness.is_match(path) || (self.outside_tests.is_match(path) && !self.is_test(path))
    }

    /// Whether `path` (normalised, relative) is the project's code: no test path, no harness,
    /// in no directory the [`TreeFilter`] skips (the code agents write).
    pub fn is_code(&self, path: &str) -> bool {
        !self.is_test(path) && !self.is_harness(path) && self.filter.skipped_dir(path).is_none()
    }

    /// The test globs.
    pub fn test_globs(&self) -> &[String] {
        &self.test_globs
    }

    /// The plain harness globs, including Consort's own files.
    pub fn harness_globs(&self) -> &[String] {
        &self.harness_globs
    }

    /// The harness globs that yield to the test paths.
    pub fn harness_outside_tests_globs(&self) -> &[String] {
        &self.outside_test_globs
    }
}

impl Default for PathPolicy {
    /// Tests under `tests/`, nothing else in the harness but Consort's own files.
    fn default() -> Self {
        // The literal globs below always compile.
        match PathPolicy::new(&["tests/**"], &[]) {
            Ok(p) => p,
            Err(_) => PathPolicy {
                test_globs: Vec::new(),
                harness_globs: Vec::new(),
                outside_test_globs: Vec::new(),
                tests: GlobSet::empty(),
                harness: GlobSet::empty(),
                outside_tests: GlobSet::empty(),
                filter: TreeFilter::default(),
                collected: None,
                identity: crate::TestIdentity::default(),
            },
        }
    }
}

/// A [`PathPolicy`] as plain data: what an assignment tells an agent about the paths, so that
/// its own check of an answer is the machine's (see [`PathPolicy::rules`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema)]
pub struct PathRules {
    /// Test-path globs: the Navigator's alone, in RED only.
    pub tests: Vec<String>,
    /// Harness globs besides Consort's own files (which are always harness): no agent's.
    pub harness: Vec<String>,
    /// Harness globs that yield to the test paths.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub harness_outside_tests: Vec<String>,
    /// The project's extra cache directory names.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub caches: Vec<String>,
    /// The files the runner collects as tests, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collected: Option<Vec<String>>,
    /// How the runner names the tests it reports.
    #[serde(default, skip_serializing_if = "is_described")]
    pub test_identity: crate::TestIdentity,
}

fn is_described(identity: &crate::TestIdentity) -> bool {
    *identity == crate::TestIdentity::Described
}

impl PathRules {
    /// The policy these rules describe.
    pub fn policy(&self) -> Result<PathPolicy, GlobError> {
        let mut p = PathPolicy::new(&self.tests, &self.harness)?
            .with_harness_outside_tests(&self.harness_outside_tests)?
            .with_caches(&self.caches)
            .with_test_identity(self.test_identity);
        if let Some(c) = &self.collected {
            p = p.with_collected(c)?;
        }
        Ok(p)
    }
}

/// Checks that `glob` compiles.
pub fn check_glob(glob: &str) -> Result<(), GlobError> {
    Glob::new(glob).map(drop).map_err(|e| GlobError {
        glob: glob.to_string(),
        detail: e.to_string(),
    })
}

/// A glob that matches exactly `path` (its metacharacters escaped).
pub fn literal_glob(path: &str) -> String {
    globset::escape(path)
}

/// Characters that make a glob more than a literal path.
const GLOB_META: [char; 7] = ['*', '?', '[', ']', '{', '}', '\\'];

/// The part of `glob` before its first metacharacter.
fn literal_prefix(glob: &str) -> &str {
    match glob.find(GLOB_META) {
        Some(i) => &glob[..i],
        None => glob,
    }
}

/// Whether `wide` matches every path `narrow` matches, by a syntactic rule that is sound but
/// conservative (`false` means "not shown", not "not covered").
///
/// `narrow` is covered when both compile and one of these holds:
/// * `narrow` is a literal path and `wide` matches it;
/// * `narrow` equals `wide`, or `wide` is `**`;
/// * `wide` is `L/**` with `L` literal and `narrow` starts with `L/` before any metacharacter;
/// * `wide` is `**/S` and `narrow` is `S` or ends with `/S`, or `wide` is `L/**/S` with `L`
///   literal and `narrow` is `L/S` or starts with `L/` and ends with `/S` — where `S` is one
///   path component made of literal characters, `*` and `?` only.
pub fn glob_covers(wide: &str, narrow: &str) -> bool {
    let Ok(wide_glob) = Glob::new(wide) else {
        return false;
    };
    if Glob::new(narrow).is_err() {
        return false;
    }
    if !narrow.contains(GLOB_META) {
        return wide_glob.compile_matcher().is_match(narrow);
    }
    if narrow == wide || wide == "**" {
        return true;
    }
    if let Some(dir) = wide.strip_suffix("/**")
        && !dir.is_empty()
        && !dir.contains(GLOB_META)
    {
        return literal_prefix(narrow).starts_with(&format!("{dir}/"));
    }
    let (dir, name) = match wide.strip_prefix("**/") {
        Some(name) => ("", name),
        None => match wide.split_once("/**/") {
            Some((dir, name)) if !dir.is_empty() && !dir.contains(GLOB_META) => (dir, name),
            _ => return false,
        },
    };
    let simple_name = !name.is_empty()
        && !name.contains("**")
        && !name.contains(['/', '[', ']', '{', '}', '\\', ',']);
    if !simple_name {
        return false;
    }
    let rest = if dir.is_empty() {
        narrow
    } else {
        match narrow.strip_prefix(&format!("{dir}/")) {
            Some(rest) => rest,
            None => return false,
        }
    };
    rest == name || rest.ends_with(&format!("/{name}"))
}

fn build_set(globs: &[String]) -> Result<GlobSet, GlobError> {
    let mut b = GlobSetBuilder::new();
    for g in globs {
        let glob = Glob::new(g).map_err(|e| GlobError {
            glob: g.clone(),
            detail: e.to_string(),
        })?;
        b.add(glob);
    }
    b.build().map_err(|e| GlobError {
        glob: globs.join(", "),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_are_normalised() {
        assert_eq!(normalise_relative("./src//a.sql").expect("ok"), "src/a.sql");
        assert_eq!(
            normalise_relative("tests/t1.sql").expect("ok"),
            "tests/t1.sql"
        );
    }

    #[test]
    fn escaping_paths_are_refused() {
        let too_long = "a".repeat(2000);
        type IsTheRefusal = fn(&PathError) -> bool;
        let cases: [(&str, IsTheRefusal); 8] = [
            ("../x", |e| matches!(e, PathError::ParentComponent { .. })),
            ("a/../../x", |e| {
                matches!(e, PathError::ParentComponent { .. })
            }),
            ("/etc/passwd", |e| matches!(e, PathError::Absolute { .. })),
            ("C:/x", |e| matches!(e, PathError::Absolute { .. })),
            ("a\\b", |e| matches!(e, PathError::BadCharacter { .. })),
            ("a\0b", |e| matches!(e, PathError::BadCharacter { .. })),
            ("./", |e| matches!(e, PathError::Empty)),
            (&too_long, |e| matches!(e, PathError::TooLong { .. })),
        ];
        for (path, is_the_refusal) in cases {
            let shown = path.escape_debug().to_string();
            match normalise_relative(path) {
                Err(e) => assert!(is_the_refusal(&e), "{shown}: {e}"),
                Ok(p) => panic!("{shown} was accepted as {p}"),
            }
        }
    }

    #[test]
    fn policy_classifies_tests_and_harness() {
        let p = PathPolicy::new(&["tests/**/*.sql"], &["run-tests.sh"]).expect("globs");
        assert!(p.is_test("tests/t1.sql"));
        assert!(p.is_test("tests/deep/t2.sql"));
        assert!(!p.is_test("src/stock.sql"));
        assert!(p.is_harness("consort.toml"));
        assert!(p.is_harness(".consort/ledger.jsonl"));
        assert!(p.is_harness("run-tests.sh"));
        assert!(!p.is_harness("src/stock.sql"));
        assert!(PathPolicy::new(&["tests/[x"], &[]).is_err());
    }

    #[test]
    fn harness_outside_the_tests_yields_to_the_test_paths_and_plain_harness_does_not() {
        let p = PathPolicy::new(&["tests/**"], &["tests/run.sh"])
            .and_then(|p| p.with_harness_outside_tests(&["**/conftest.py", "**/pyproject.toml"]))
            .expect("globs");
        assert!(p.is_harness("conftest.py"));
        assert!(p.is_harness("src/pkg/conftest.py"));
        assert!(p.is_harness("pyproject.toml"));
        assert!(!p.is_harness("tests/conftest.py"));
        assert!(p.is_test("tests/conftest.py"));
        assert!(
            p.is_harness("tests/run.sh"),
            "plain harness wins inside the test paths"
        );
        assert!(!p.is_harness("src/app.py"));
        assert_eq!(
            p.harness_outside_tests_globs(),
            ["**/conftest.py", "**/pyproject.toml"]
        );
        assert!(
            PathPolicy::default()
                .with_harness_outside_tests(&["[x"])
                .is_err()
        );
    }

    #[test]
    fn literal_globs_match_only_their_path() {
        let g = literal_glob("scripts/run[1]*.sh");
        let m = Glob::new(&g).expect("compiles").compile_matcher();
        assert!(m.is_match("scripts/run[1]*.sh"));
        assert!(!m.is_match("scripts/run1x.sh"));
        assert!(check_glob(&g).is_ok());
        assert!(check_glob("tests/[x").is_err());
        assert!(check_glob("tests/{a").is_err());
    }

    #[test]
    fn glob_covers_accepts_equal_and_narrower_globs() {
        for (wide, narrow) in [
            ("tests/**", "tests/**"),
            ("tests/**", "tests/**/*.sql"),
            ("tests/**", "tests/unit/*.sql"),
            ("tests/**", "tests/{a,b}/*.sql"),
            ("db/tests/**", "db/tests/x/**"),
            ("**", "src/**/*.sql"),
            ("**/*.sql", "*.sql"),
            ("**/*.sql", "tests/**/*.sql"),
            ("**/*.sql", "tests/unit/*.sql"),
            ("tests/**/*.sql", "tests/*.sql"),
            ("tests/**/*.sql", "tests/**/*.sql"),
            ("tests/**/*.sql", "tests/unit/**/*.sql"),
            ("tests/*.sql", "tests/a.sql"),
            ("tests/**", "tests/deep/t1.sql"),
        ] {
            assert!(glob_covers(wide, narrow), "{wide} should cover {narrow}");
        }
    }

    #[test]
    fn glob_covers_refuses_what_it_cannot_show() {
        for (wide, narrow) in [
            ("tests/**", "tests"),
            ("tests/**", "tests*/*.sql"),
            ("tests/**", "test/**"),
            ("tests/**", "**/tests/*.sql"),
            ("tests/**", "src/**/*.sql"),
            ("tests/**", "{tests,src}/*.sql"),
            ("tests/**", "tests/{a"),
            ("tests/**/*.sql", "tests/**"),
            ("tests/**/*.sql", "tests/**/*.sq"),
            ("tests/**/*.sql", "src/*.sql"),
            ("**/*.sql", "tests/**/{a,b}.sql"),
            ("**/*_test.sql", "tests/**/*.sql"),
            ("tests/*.sql", "tests/a.py"),
            ("tests/{a", "tests/a"),
        ] {
            assert!(!glob_covers(wide, narrow), "{wide} must not cover {narrow}");
        }
    }

    /// Soundness: whenever `glob_covers` says yes, no path the narrow glob matches escapes the
    /// wide one — checked over every pair of a set of globs and every path of a small tree.
    #[test]
    fn glob_covers_never_claims_a_cover_a_path_refutes() {
        let globs = [
            "**",
            "tests/**",
            "tests/**/*.sql",
            "tests/*.sql",
            "tests/unit/*.sql",
            "**/*.sql",
            "*.sql",
            "tests/a.sql",
            "tests/unit/**",
            "src/**/*.sql",
            "tests*/*.sql",
            "**/unit/*.sql",
            "tests/**/a.sql",
            "tests/?.sql",
            "{tests,src}/*.sql",
            "tests/**/unit/*.sql",
            "**/a*",
            "tests/unit/**/*.sql",
            "**/tests/**",
        ];
        let parts = ["tests", "src", "unit", "a.sql", "b.py", "testsx"];
        let mut paths: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
        for _ in 0..2 {
            let longer: Vec<String> = paths
                .iter()
                .flat_map(|p| parts.iter().map(move |q| format!("{p}/{q}")))
                .collect();
            paths.extend(longer);
        }
        paths.sort();
        paths.dedup();
        let matcher = |g: &str| Glob::new(g).expect("compiles").compile_matcher();
        let mut covers = 0;
        for wide in globs {
            let w = matcher(wide);
            for narrow in globs {
                if !glob_covers(wide, narrow) {
                    continue;
                }
                covers += 1;
                let n = matcher(narrow);
                for p in &paths {
                    assert!(
                        !n.is_match(p) || w.is_match(p),
                        "{wide} claimed to cover {narrow}, but {p} escapes it"
                    );
                }
            }
        }
        assert!(
            covers > globs.len(),
            "the check must also accept narrowings ({covers})"
        );
    }

    #[test]
    fn version_control_metadata_is_harness_at_any_depth() {
        let p = PathPolicy::default();
        for path in [
            ".git",
            ".git/config",
            ".git/hooks/pre-commit",
            "vendor/lib/.git",
            "vendor/lib/.git/config",
            ".hg/hgrc",
            "sub/.svn/entries",
        ] {
            assert!(p.is_harness(path), "{path}");
        }
        for path in [
            ".gitignore",
            "src/git/x.sql",
            "docs/.github/x.md",
            "a.git/x",
        ] {
            assert!(!p.is_harness(path), "{path}");
        }
    }

    #[test]
    fn caches_are_skipped_at_any_depth_and_are_never_tests() {
        let f = TreeFilter::new(&["build", "target", "build"]);
        assert_eq!(
            f.extra(),
            ["build".to_string()],
            "defaults and repeats dropped"
        );
        assert!(f.skips("__pycache__") && f.skips(".git") && f.skips(".consort"));
        assert!(f.skips("build") && !f.skips("src"));
        assert_eq!(
            f.skipped_dir("tests/__pycache__/t1.cpython-311.pyc"),
            Some("__pycache__")
        );
        assert_eq!(f.skipped_dir("sub/target/x"), Some("target"));
        assert_eq!(f.skipped_dir("a/build/b/node_modules/c"), Some("build"));
        assert_eq!(
            f.skipped_dir("src/target"),
            None,
            "a file named target is a file"
        );
        assert_eq!(f.skipped_dir("src/items.sql"), None);
        let p = PathPolicy::default().with_caches(&["build"]);
        assert!(p.is_test("tests/t1.sql"));
        assert!(!p.is_test("tests/__pycache__/t1.cpython-311.pyc"));
        assert!(!p.is_test("tests/build/t1.sql"));
        assert!(PathPolicy::default().is_test("tests/build/t1.sql"));
    }

    #[test]
    fn cache_names_are_directory_names() {
        assert!(TreeFilter::check_name("build").is_ok());
        assert!(TreeFilter::check_name(".cache").is_ok());
        for bad in ["", ".", "..", "a/b", "a\\b", "x\ny", &"n".repeat(300)] {
            assert!(TreeFilter::check_name(bad).is_err(), "{bad:?}");
        }
    }
}
