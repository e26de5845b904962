//! The tools a build step may use while it works: read a file, list files, search text, and try
//! a change on a scratch copy of the tree.
//!
//! An agent reaches them only through the [`Tools`] handle its assignment carries; the conductor
//! hands one to RED, GREEN, repair, REFACTOR and REVIEW assignments (see
//! `conductor::workbench`, wired to the Lakebase side by the program that starts the run). The
//! agent crates never depend on the database crate.
//!
//! **Invariant: a scratch run is advice.** Its result goes back to the agent as an [`Advice`];
//! it is never a receipt, never enters the ledger and never stands in for the step's real run,
//! which the conductor still makes on a fresh branch after the change set is accepted.

use std::sync::Arc;

use crate::core::artifact::{ChangeSet, TestOutcome};
use crate::runtime::gate::BoxFuture;

/// The tools of one step. Every method is confined to the project's work tree, judged by the
/// file a path reaches, and bounded; none can change the work tree itself.
pub trait Workbench: Send + Sync {
    /// Reads a text file of the tree (capped; [`FileText::truncated`] says when).
    fn read(&self, path: &str) -> Result<FileText, ToolError>;

    /// Lists the tree's files, those matching `glob` when given (capped; the rest counted).
    fn list(&self, glob: Option<&str>) -> Result<Listing, ToolError>;

    /// Finds the lines that contain `text` (literally), in the files matching `glob` when given.
    fn search(&self, text: &str, glob: Option<&str>) -> Result<Hits, ToolError>;

    /// Applies `change` to a scratch copy of the tree and runs the tests there, on a scratch
    /// branch, by the same runner and confinement as the step's real run; answers how the real
    /// run would judge it. Bounded per step ([`ToolError::RunsSpent`]).
    fn try_change(&self, change: ChangeSet) -> BoxFuture<'_, Result<Advice, ToolError>>;
}

/// A shared workbench is one (the handle below holds one this way).
impl<W: Workbench + ?Sized> Workbench for Arc<W> {
    fn read(&self, path: &str) -> Result<FileText, ToolError> {
        (**self).read(path)
    }

    fn list(&self, glob: Option<&str>) -> Result<Listing, ToolError> {
        (**self).list(glob)
    }

    fn search(&self, text: &str, glob: Option<&str>) -> Result<Hits, ToolError> {
        (**self).search(text, glob)
    }

    fn try_change(&self, change: ChangeSet) -> BoxFuture<'_, Result<Advice, ToolError>> {
        (**self).try_change(change)
    }
}

/// The handle on a step's [`Workbench`] that an [`Assignment`](crate::Assignment) carries.
///
/// It is not serialised (a program given the assignment as JSON gets no tools) and two handles
/// are equal only when they are the same workbench.
#[derive(Clone)]
pub struct Tools(Arc<dyn Workbench>);

impl Tools {
    /// A handle on `bench`.
    pub fn new(bench: impl Workbench + 'static) -> Self {
        Tools(Arc::new(bench))
    }

    /// The workbench.
    pub fn bench(&self) -> &dyn Workbench {
        &*self.0
    }
}

impl std::fmt::Debug for Tools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Tools")
    }
}

impl PartialEq for Tools {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Tools {}

/// A file as [`Workbench::read`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileText {
    /// The path read: the file the asked path reaches, relative to the tree.
    pub path: String,
    /// Its text (its beginning, when truncated).
    pub text: String,
    /// Its whole size in bytes.
    pub bytes: u64,
    /// Whether the text stops before the end of the file.
    pub truncated: bool,
}

/// What [`Workbench::list`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Listing {
    /// Paths and sizes in bytes, sorted.
    pub files: Vec<(String, u64)>,
    /// Matching files past the cap, not listed.
    pub more: u64,
}

/// What [`Workbench::search`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Hits {
    /// The matching lines, in path and line order.
    pub hits: Vec<Hit>,
    /// Whether more lines matched than are returned.
    pub more: bool,
}

/// One line that matched.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    /// The file.
    pub path: String,
    /// The line number, from 1.
    pub line: u32,
    /// The line (clipped).
    pub text: String,
}

/// What a scratch run would have meant: advice for the agent, never evidence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Advice {
    /// Whether the step's real run of the same tree would be accepted.
    pub would_pass: bool,
    /// The machine's verdict, with the run's output (capped).
    pub verdict: String,
    /// Each test's outcome.
    pub outcomes: Vec<TestOutcome>,
    /// Scratch runs this step has left.
    pub runs_left: u32,
}

/// Why a tool could not answer. Its text is written for the model that called the tool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ToolError {
    /// No such file.
    #[error("{path}: no such file")]
    NotFound {
        /// The path asked.
        path: String,
    },
    /// The path may not be read: it leaves the tree, reaches Consort's state or a skipped
    /// directory, or names a directory.
    #[error("{path}: {reason}")]
    Refused {
        /// The path asked.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file is not UTF-8 text.
    #[error("{path}: not text ({bytes} bytes)")]
    NotText {
        /// The path read.
        path: String,
        /// Its size.
        bytes: u64,
    },
    /// The glob or the search text cannot be used.
    #[error("{0}")]
    BadPattern(String),
    /// This step may not try changes (a review writes nothing).
    #[error("step {step} cannot try changes")]
    NoRuns {
        /// The step.
        step: String,
    },
    /// Every scratch run of the step is used.
    #[error("all {max} scratch runs of this step are used; answer with your change set")]
    RunsSpent {
        /// The limit.
        max: u32,
    },
    /// The change breaks a rule its real change set would be refused for; nothing ran.
    #[error("the change would be refused, so it did not run: {violation}")]
    Rejected {
        /// The machine's words.
        violation: String,
    },
    /// The scratch run could not be made (the database, the disk).
    #[error("the scratch run could not be made: {detail}")]
    Failed {
        /// What happened (never a secret).
        detail: String,
    },
}

/// The bounds of a step's workbench.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkbenchLimits {
    /// Scratch runs per assignment. Default 3.
    pub runs: u32,
    /// Bytes of one file [`Workbench::read`] returns. Default 64 KiB.
    pub read_bytes: usize,
    /// Lines one search returns. Default 100.
    pub hits: usize,
}

impl Default for WorkbenchLimits {
    fn default() -> Self {
        WorkbenchLimits {
            runs: 3,
            read_bytes: 64 * 1024,
            hits: 100,
        }
    }
}
