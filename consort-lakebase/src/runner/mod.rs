//! Test runners: run a work tree's tests against one branch and report per-test outcomes.
//!
//! * [`PsqlRunner`]: each test `.sql` file in its own `psql` session, in a transaction that is
//!   rolled back; one test per file, named by its work-tree-relative path; pass = exit 0 of a
//!   session that opened, fail = exit 3 (an error the server raised in the test's statements);
//!   psql's own fatal error, no session, or a program that ran nothing is the run's fault.
//! * [`CommandRunner`]: the project's test command (`cargo test`, `pytest -q`, …) with
//!   outcomes from a JUnit XML file or TAP, or a single-test command per expected test.
//!
//! Both run with a scrubbed environment that carries only the branch's credentials (see
//! [`EnvPolicy`]), kill the whole process group at the time limit, and stream the output into
//! a digest plus a capped excerpt. A failing test is an outcome, never an error: a runner
//! returns [`Error::Runner`](crate::Error::Runner) only when it cannot run at all, and
//! [`Error::Connection`](crate::Error::Connection) when it lost its connection to the branch mid-run
//! (the database's fault, so the verification is retried rather than judged).

mod capture;
mod command;
mod denial;
mod forward;
mod go_list;
mod jest_list;
mod junit;
pub(crate) mod missing_module;
mod namespaces;
pub(crate) mod process;
mod psql;
mod sandbox;
mod select;
mod session;
mod stdout_format;
mod tap;
mod view;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use consort_actors::TreeFilter;
use consort_actors::{ContentHash, ExitRecord, TestOutcome};

use crate::error::Result;
use crate::provider::{BoxFuture, ConnectInfo};

pub use capture::{Capture, Captured, OutputLimits};
pub use command::{CommandRunner, CommandRunnerConfig};
pub use jest_list::JEST_FILE_CLASSNAME;
pub use junit::parse_junit;
pub use missing_module::{
    PROJECT_PYTHON, python_lacks, python_lacks_advice, unused_project_python,
};
pub use process::{DEFAULT_ENV_ALLOW, EnvPolicy, NON_INTERACTIVE, shell_quote};
pub use psql::{PsqlRunner, PsqlRunnerConfig};
use sandbox::dependency_dirs;
pub use sandbox::{Jail, JailSpec, SandboxMode, SandboxSupport, Scratch, sweep_abandoned_scratch};
pub use select::Selector;
pub use session::{PINNED, SessionSettings};
pub use stdout_format::{StdoutFormat, parse_go_test_json, parse_libtest};
pub use tap::parse_tap;

/// What a runner is asked to do. Its `Debug` shows no secret (the connection redacts its own).
#[derive(Clone, Debug)]
pub struct RunContext {
    /// The work tree (tests run with it as the working directory).
    pub work_tree: PathBuf,
    /// The branch's connection (its secret reaches only the test processes).
    pub conn: ConnectInfo,
    /// The runner names of the tests expected so far.
    pub tests: Vec<String>,
    /// The test whose outcome matters most (the new test in RED).
    pub focus: Option<String>,
    /// The test files to run, relative to the work tree: a shard of the suite (see
    /// [`TestRunner::collect`]). `None` runs the whole suite.
    pub select: Option<Vec<String>>,
    /// The confinement of every process the run starts.
    pub jail: Jail,
    /// The run's private scratch directory (`HOME`, `TMPDIR`, reports).
    pub scratch: Arc<Scratch>,
    /// The settings pinned for every database session of the run.
    pub pinned: SessionSettings,
    /// The directories never searched for code or tests: the defaults and the project's
    /// caches (the verifier takes them from the request).
    pub filter: TreeFilter,
    /// Consort's private state (canonical paths), left out of every view of the tree.
    hidden: Vec<PathBuf>,
}

impl RunContext {
    /// A context for a run of `work_tree` against `conn`, confined as `mode` says: Consort's
    /// private state in `hidden` unreadable, writes only in a fresh scratch directory and the
    /// tree's existing `cache_dirs`, TCP only to the branch's port. No tests are expected yet,
    /// only `public` is searched and only the default caches are skipped; set the fields to
    /// change that.
    pub fn prepare(
        work_tree: PathBuf,
        conn: ConnectInfo,
        mode: SandboxMode,
        hidden: Vec<PathBuf>,
        cache_dirs: Vec<PathBuf>,
    ) -> Result<RunContext> {
        let scratch = Scratch::create()?;
        let mut writable = vec![scratch.writable()];
        writable.extend(cache_dirs);
        let hidden: Vec<PathBuf> = hidden
            .iter()
            .filter_map(|p| p.canonicalize().ok())
            .collect();
        let read_only = dependency_dirs(&work_tree);
        // A /dev/shm of the run's own is mounted over the machine's: it would hide a tree, a
        // scratch directory or a dependency that lives under it (a project in /dev/shm).
        let shm = (!under_dev_shm(
            [&work_tree, &scratch.writable()]
                .into_iter()
                .chain(&read_only)
                .chain(&writable),
        ))
        .then(|| scratch.shm());
        let spec = JailSpec {
            hidden: hidden.clone(),
            tree: Some(work_tree.clone()),
            writable,
            create_only: Some(scratch.views()),
            branch: (!conn.host.starts_with('/')).then(|| (conn.host.clone(), conn.port)),
            read_only,
            shm,
        };
        let jail = Jail::prepare(mode, &spec)?;
        Ok(RunContext {
            work_tree,
            conn,
            tests: Vec::new(),
            focus: None,
            select: None,
            jail,
            scratch: Arc::new(scratch),
            pinned: SessionSettings::default(),
            filter: TreeFilter::default(),
            hidden,
        })
    }

    /// A fresh view of the work tree for one process of the run to start in (see `view.rs`):
    /// links to the tree's entries, Consort's private state left out, new files allowed and
    /// discarded with the run.
    pub fn view(&self) -> Result<PathBuf> {
        let tree = self
            .work_tree
            .canonicalize()
            .unwrap_or_else(|_| self.work_tree.clone());
        let hidden: Vec<PathBuf> = self
            .hidden
            .iter()
            .filter(|h| !tree.starts_with(h))
            .cloned()
            .collect();
        view::make_view(&self.scratch.views(), &self.work_tree, &hidden)
    }

    /// [`RunContext::view`] for a process about to start: a view that cannot be made means the
    /// runner cannot run.
    pub(crate) fn process_view(&self) -> Result<PathBuf> {
        self.view().map_err(|e| {
            crate::Error::Runner(format!(
                "cannot start in a view of {}: {}",
                self.work_tree.display(),
                consort_actors::error_chain(&e)
            ))
        })
    }

    /// The expected tests and the focus, without duplicates, in order.
    pub fn expected(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for t in self.tests.iter().chain(self.focus.iter()) {
            if !out.contains(t) {
                out.push(t.clone());
            }
        }
        out
    }
}

/// Whether any of `paths` is, or resolves to, a place under `/dev/shm`.
fn under_dev_shm<'p>(paths: impl IntoIterator<Item = &'p PathBuf>) -> bool {
    let shm = Path::new("/dev/shm");
    let shm = shm.canonicalize().unwrap_or_else(|_| shm.to_path_buf());
    paths.into_iter().any(|p| {
        p.canonicalize()
            .unwrap_or_else(|_| p.clone())
            .starts_with(&shm)
    })
}

/// What a runner reports; the verification turns it into a receipt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunReport {
    /// The command line that ran (no secrets).
    pub command: String,
    /// Per-test outcomes.
    pub outcomes: Vec<TestOutcome>,
    /// How the run ended.
    pub exit: ExitRecord,
    /// SHA-256 of the whole output.
    pub output_digest: ContentHash,
    /// The start and end of the output.
    pub output_excerpt: String,
    /// Output size in bytes.
    pub output_bytes: u64,
    /// The tests whose database session broke off before they finished (reported errored).
    /// Whose fault that was is for the verifier to decide (see `Verifier::verify`).
    pub sessions_lost: Vec<String>,
}

/// One test of a suite as its runner collects it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SuiteTest {
    /// The test file it is in, relative to the work tree.
    pub file: String,
    /// Its name as the runner reports its outcome.
    pub name: String,
}

/// The whole suite as a runner lists it: what the shards of a split run must together run.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Suite {
    /// Every test listed, with its file.
    pub tests: Vec<SuiteTest>,
    /// The test files the listing could not load (a file whose import fails): their tests are
    /// unknown, so each still runs in a shard, where its failure is seen as in a whole run.
    pub unloaded: Vec<String>,
}

impl Suite {
    /// A suite of `tests` whose every file loaded.
    pub fn of(tests: Vec<SuiteTest>) -> Suite {
        Suite {
            tests,
            unloaded: Vec::new(),
        }
    }
}

/// Runs tests against a branch. Object-safe: used as `Arc<dyn TestRunner>`.
pub trait TestRunner: Send + Sync + fmt::Debug {
    /// A short name for receipts: `psql`, `command`.
    fn name(&self) -> &'static str;

    /// Runs the tests (only the files of [`RunContext::select`] when it is set). Red tests
    /// are outcomes; an error means the runner could not run.
    fn run<'a>(&'a self, ctx: &'a RunContext) -> BoxFuture<'a, Result<RunReport>>;

    /// The whole suite of `ctx`'s tree as this runner collects it, each test with its file,
    /// and the test files it could not load, when the runner can run a selection of test
    /// files ([`RunContext::select`]): what the shards of a split suite must together run,
    /// neither less nor more. `None`: this runner runs whole (the default).
    fn collect<'a>(&'a self, _ctx: &'a RunContext) -> BoxFuture<'a, Result<Option<Suite>>> {
        Box::pin(async { Ok(None) })
    }

    /// Whether this runner can run a selection of test files and list its whole suite
    /// ([`TestRunner::collect`]); `false` (the default) runs every suite whole.
    fn selects(&self) -> bool {
        false
    }

    /// Whether running a selection that names the test file `selected` also runs the test
    /// file `other` (a tool that matches its arguments as parts of paths, as vitest does).
    /// Exact by default: a selection runs the files it names and no other.
    fn selection_reaches(&self, selected: &str, other: &str) -> bool {
        selected == other
    }

    /// The test file that holds the test named `test`, among the `files` of the work tree
    /// `tree`, when this runner can tell from the name (and the files' text) alone: a test
    /// likely to fail runs first, before the suite is listed. `None` (the default): it cannot.
    fn file_of(&self, _test: &str, _files: &[String], _tree: &Path) -> Option<String> {
        None
    }
}

/// The text of the regular file at `path` when it is one of at most 4 MiB (a listing reads the
/// tree's own files: a pipe or device there must not block it, nor a huge file fill memory).
pub(crate) fn read_small_file(path: &Path) -> Option<String> {
    const MAX: u64 = 4 << 20;
    let meta = std::fs::metadata(path).ok()?;
    if !meta.is_file() || meta.len() > MAX {
        return None;
    }
    std::fs::read_to_string(path).ok()
}

/// [`redact`] for what each test said: a failing test may print its connection.
pub(crate) fn redact_outcomes(outcomes: &mut [TestOutcome], conn: &ConnectInfo) {
    for message in outcomes.iter_mut().filter_map(|o| o.message.as_mut()) {
        *message = redact(message, conn);
    }
}

/// Replaces the secret in text that will be shown (defence in depth for command strings).
pub(crate) fn redact(text: &str, conn: &ConnectInfo) -> String {
    let secret = conn.secret.expose();
    if secret.is_empty() {
        text.to_string()
    } else {
        text.replace(secret, "***")
    }
}

/// Each outcome as its test name and status, in order, joined by `, ` (`adds passed, subtracts
/// failed`): what a parser's tests compare.
#[cfg(test)]
pub(crate) fn outcomes_text(outcomes: &[TestOutcome]) -> String {
    let each: Vec<String> = outcomes
        .iter()
        .map(|o| format!("{} {}", o.name, o.status))
        .collect();
    each.join(", ")
}
