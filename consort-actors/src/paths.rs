//! Which paths are tests, which are the harness, and which are not paths at all.
//!
//! This is the pure half of path safety: lexical checks, glob classification and the names of
//! the directories that are never hashed ([`TreeFilter`]), used by the state machine. The
//! file-system half (symlinks, what the OS accepts) lives in [`crate::worktree`].

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

/// Globs that are always part of the harness: Consort's own files, and version-control
/// metadata at any depth (hooks and configuration run code outside any test run).
pub const ALWAYS_HARNESS: [&str; 9] = [
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

/// Version-control metadata directories: never hashed, and part of the harness at any depth.
pub const VCS_DIRS: [&str; 3] = [".git", ".hg", ".svn"];

/// Consort's own state directory: never hashed (at any depth), and part of the harness at the top.
pub const STATE_DIR: &str = ".consort";

/// The longest file name (one path component, in bytes) the work tree accepts: the common
/// `NAME_MAX` of Linux and macOS file systems.
pub const MAX_NAME_BYTES: usize = 255;

/// Why a path is refused before any file is touched.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "problem", rename_all = "kebab-case")]
pub enum PathError {
    /// Empty, or only dots and slashes.
    #[error("empty path")]
    Empty,
    /// Starts at the root (`/x`) or a drive.
    #[error("absolute path {path:?} is outside the work tree")]
    Absolute {
        /// The path.
        path: String,
    },
    /// Contains a `..` component.
    #[error("path {path:?} climbs out of the work tree")]
    ParentComponent {
        /// The path.
        path: String,
    },
    /// Contains a NUL byte, a backslash or a control character.
    #[error("path {path:?} contains a forbidden character")]
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
    #[error("path {path:?} resolves outside the work tree")]
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
pub enum WriteProblem {
    /// A path component is longer than the file system allows.
    #[error("a path component is {len} bytes long; at most {max}")]
    NameTooLong {
        /// Its length in bytes.
        len: usize,
        /// The limit ([`MAX_NAME_BYTES`]).
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
#[error("bad glob {glob:?}: {detail}")]
pub struct GlobError {
    /// The glob.
    pub glob: String,
    /// The parser's complaint.
    pub detail: String,
}

/// A cache directory name that cannot name a directory.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad cache directory name {name:?}: {detail}")]
pub struct CacheNameError {
    /// The name.
    pub name: String,
    /// What is wrong with it.
    pub detail: String,
}

/// The directories whose contents are never hashed, never listed, never handed to an agent and
/// never taken for test files, matched by name at any depth: [`DEFAULT_CACHES`], [`VCS_DIRS`],
/// [`STATE_DIR`], and the project's extra cache names (`[paths] caches`).
///
/// One definition for everyone who hashes or lists a work tree: the conductor's
/// [`crate::worktree::WorkTree`], the verifier (through [`crate::protocol::VerifyRequest`]), the
/// psql runner and the external-command agent. Since no receipt covers these directories, the
/// state machine refuses any change set that writes into one
/// ([`crate::machine::RuleViolation::TouchesUnhashed`]).
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
#[derive(Debug, Clone)]
pub struct PathPolicy {
    test_globs: Vec<String>,
    harness_globs: Vec<String>,
    tests: GlobSet,
    harness: GlobSet,
    filter: TreeFilter,
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
            test_globs,
            harness_globs: harness,
            filter: TreeFilter::default(),
        })
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
        self.harness.is_match(path)
    }

    /// The test globs.
    pub fn test_globs(&self) -> &[String] {
        &self.test_globs
    }

    /// The harness globs, including Consort's own files.
    pub fn harness_globs(&self) -> &[String] {
        &self.harness_globs
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
                tests: GlobSet::empty(),
                harness: GlobSet::empty(),
                filter: TreeFilter::default(),
            },
        }
    }
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
        assert!(matches!(
            normalise_relative("../x"),
            Err(PathError::ParentComponent { .. })
        ));
        assert!(matches!(
            normalise_relative("a/../../x"),
            Err(PathError::ParentComponent { .. })
        ));
        assert!(matches!(
            normalise_relative("/etc/passwd"),
            Err(PathError::Absolute { .. })
        ));
        assert!(matches!(
            normalise_relative("C:/x"),
            Err(PathError::Absolute { .. })
        ));
        assert!(matches!(
            normalise_relative("a\\b"),
            Err(PathError::BadCharacter { .. })
        ));
        assert!(matches!(
            normalise_relative("a\0b"),
            Err(PathError::BadCharacter { .. })
        ));
        assert!(matches!(normalise_relative("./"), Err(PathError::Empty)));
        assert!(matches!(
            normalise_relative(&"a".repeat(2000)),
            Err(PathError::TooLong { .. })
        ));
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
