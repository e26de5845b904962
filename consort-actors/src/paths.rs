//! Which paths are tests, which are the harness, and which are not paths at all.
//!
//! This is the pure half of path safety: lexical checks and glob classification, used by the
//! state machine. The file-system half (symlinks) lives in [`crate::worktree`].

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde::{Deserialize, Serialize};

/// Globs that are always part of the harness: Consort's own files.
pub const ALWAYS_HARNESS: [&str; 3] = ["consort.toml", ".consort", ".consort/**"];

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

/// Classifies work-tree paths as test paths and harness paths.
///
/// Test paths are the Navigator's alone (and only in RED). Harness paths — Consort's own files
/// and the runner's configuration and scripts — belong to no agent.
#[derive(Debug, Clone)]
pub struct PathPolicy {
    test_globs: Vec<String>,
    harness_globs: Vec<String>,
    tests: GlobSet,
    harness: GlobSet,
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
        })
    }

    /// Whether `path` (normalised, relative) is a test path.
    pub fn is_test(&self, path: &str) -> bool {
        self.tests.is_match(path)
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
}
