//! `[runner]`: how the project's tests run. Read by [`crate::config::runner_harness`], which decides
//! what the runner's configuration makes harness, and by the rest of [`crate::config`].

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// `[runner]`: how tests run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum RunnerConfig {
    /// Each SQL test file with `psql` on the branch.
    Psql {
        /// Code files loaded before the tests.
        #[serde(default = "default_setup")]
        setup: Vec<String>,
        /// Test files.
        #[serde(default = "default_sql_tests")]
        tests: Vec<String>,
        /// Time limit per file, in seconds.
        #[serde(default = "default_runner_timeout")]
        timeout_secs: u64,
        /// `"landlock"` (the default) or `"off"`.
        #[serde(default)]
        sandbox: Sandbox,
        /// Most shards a verification splits the suite into, each test file in one, each shard
        /// in its own process on its own branch (besides a first shard of the tests likely to
        /// fail); 1 runs the suite whole. Default: `[pool] max_concurrent`, at most the
        /// machine's cores.
        #[serde(default)]
        shards: Option<usize>,
        /// Split the suite only once a run of it has taken this many seconds (tests alone);
        /// shorter suites run whole, as splitting costs a runner start per shard. Default 4.
        #[serde(default)]
        split_above_secs: Option<u64>,
        /// What a build step's run covers: `"whole"` (the default: the whole suite, every
        /// time) or `"feature"` (the feature's own tests; the whole suite at the end of each
        /// story, at the deploy gate and in the merge check).
        #[serde(default)]
        per_step: consort_actors::StepScope,
    },
    /// The project's own test command.
    Command {
        /// The command, run with `sh -c` in the work tree.
        command: String,
        /// A JUnit XML report it writes, relative to the work tree.
        #[serde(default)]
        junit: Option<PathBuf>,
        /// Read per-test results from its standard output (when there is no JUnit report).
        #[serde(default = "default_true")]
        tap: bool,
        /// The form of those results: `"tap"` (the default), `"libtest"` (`cargo test`'s
        /// `test <name> ... ok` lines) or `"go-test-json"` (`go test -json`).
        #[serde(default)]
        stdout: consort_lakebase::StdoutFormat,
        /// A command that runs one test (`{test}` is replaced).
        #[serde(default)]
        single_test: Option<String>,
        /// Time limit of the whole run, in seconds.
        #[serde(default = "default_runner_timeout")]
        timeout_secs: u64,
        /// Extra environment variables passed through (besides PATH, HOME, LANG, …).
        #[serde(default)]
        pass_env: Vec<String>,
        /// Variables set to fixed values for the tests (`APP_MODE = "test"`). The branch's
        /// variables (`DATABASE_URL`, `PG*`) and the run's own (`HOME`, `TMPDIR`, `CONSORT_*`)
        /// cannot be set here.
        #[serde(default)]
        env_set: std::collections::BTreeMap<String, String>,
        /// Globs of the files the command runs as tests. Default: what the test tool the
        /// command names collects by default (pytest `**/test_*.py` and `**/*_test.py`, go
        /// `**/*_test.go`, vitest and jest `**/*.test.*`, `**/*.spec.*`, `**/__tests__/**`);
        /// unknown tools: every test path. A test-list entry elsewhere is refused.
        #[serde(default)]
        collects: Option<Vec<String>>,
        /// Start every process of a run in a fresh view of the tree, where the test tool may
        /// create files (beside its configuration) that are then discarded. Default: on for
        /// vitest (vite writes its bundled configuration beside the file), off otherwise
        /// (jest's crawler does not follow the view's links).
        #[serde(default)]
        view: Option<bool>,
        /// `"landlock"` (the default) or `"off"`.
        #[serde(default)]
        sandbox: Sandbox,
        /// What a build step's run covers, as for `psql`.
        #[serde(default)]
        per_step: consort_actors::StepScope,
        /// Most shards a verification splits the suite into, as for `psql`.
        #[serde(default)]
        shards: Option<usize>,
        /// Split the suite only once a run of it has taken this many seconds, as for `psql`.
        #[serde(default)]
        split_above_secs: Option<u64>,
    },
}

/// The variables a run sets itself besides the branch's ([`consort_lakebase::BRANCH_ENV`]),
/// which `[runner] env_set` may not set either: the pinned session and the scratch directory.
pub const RUN_OWN_ENV: &[&str] = &[
    "PGOPTIONS",
    "PGCONNECT_TIMEOUT",
    "HOME",
    "TMPDIR",
    "PYTHONDONTWRITEBYTECODE",
];

/// Checks `[runner] env_set`: names a shell can export, none a run sets itself, no `CONSORT_*`.
pub(super) fn check_env_set(
    vars: &std::collections::BTreeMap<String, String>,
) -> Result<(), String> {
    for name in vars.keys() {
        let mut chars = name.chars();
        let valid = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("`{name}` is not a variable name"));
        }
        let name_str = name.as_str();
        if consort_lakebase::BRANCH_ENV.contains(&name_str)
            || RUN_OWN_ENV.contains(&name_str)
            || name.starts_with("CONSORT_")
        {
            return Err(format!(
                "{name} is set by every run (the branch's connection or the run's scratch directory) and cannot be set here"
            ));
        }
    }
    Ok(())
}

/// `[runner] sandbox`: how test runs are confined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Sandbox {
    /// Linux Landlock; verification refuses to run where the kernel lacks it.
    #[default]
    Landlock,
    /// No confinement, said in every receipt. Only for machines without Landlock.
    Off,
}

impl RunnerConfig {
    /// How verifications split the suite: `shards`, or by default as many shards as
    /// `max_concurrent` verifications and the machine's cores allow; split only above
    /// `split_above_secs`.
    pub fn shards(&self, max_concurrent: usize) -> consort_lakebase::Shards {
        let (RunnerConfig::Psql {
            shards,
            split_above_secs,
            ..
        }
        | RunnerConfig::Command {
            shards,
            split_above_secs,
            ..
        }) = self;
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        consort_lakebase::Shards {
            max: shards.unwrap_or_else(|| max_concurrent.min(cores)).max(1),
            split_above_ms: split_above_secs
                .map_or(consort_lakebase::Shards::SPLIT_ABOVE_MS, |s| {
                    s.saturating_mul(1000)
                }),
        }
    }

    /// What a build step's run covers (`per_step`).
    pub fn per_step(&self) -> consort_actors::StepScope {
        let (RunnerConfig::Psql { per_step, .. } | RunnerConfig::Command { per_step, .. }) = self;
        *per_step
    }

    /// How test runs are confined.
    pub fn sandbox(&self) -> consort_lakebase::SandboxMode {
        let (RunnerConfig::Psql { sandbox, .. } | RunnerConfig::Command { sandbox, .. }) = self;
        match sandbox {
            Sandbox::Landlock => consort_lakebase::SandboxMode::Landlock,
            Sandbox::Off => consort_lakebase::SandboxMode::Off,
        }
    }
}

fn default_setup() -> Vec<String> {
    vec!["src/**/*.sql".into()]
}
fn default_sql_tests() -> Vec<String> {
    vec!["tests/**/*.sql".into()]
}
fn default_runner_timeout() -> u64 {
    300
}
pub(super) fn default_true() -> bool {
    true
}

impl Default for RunnerConfig {
    fn default() -> Self {
        RunnerConfig::Psql {
            setup: default_setup(),
            tests: default_sql_tests(),
            timeout_secs: default_runner_timeout(),
            sandbox: Sandbox::default(),
            shards: None,
            split_above_secs: None,
            per_step: Default::default(),
        }
    }
}
