//! `consort.toml`: the project's configuration.
//!
//! Every table refuses unknown keys, so a typo is an error that names the key and its line,
//! never a silently ignored setting. Secrets are never written here: only the *names* of the
//! environment variables that hold them.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use consort_actors::{MachineConfig, PathPolicy, Role, TreeFilter};
use consort_agents::AgentConfig;
use serde::{Deserialize, Serialize};

use crate::config::runner_harness::{RunnerHarness, check_runner};
use runner::check_env_set;
pub use runner::{RUN_OWN_ENV, RunnerConfig, Sandbox};

mod budget;
mod migrations;
pub(crate) mod runner;
pub mod runner_facts;
pub mod runner_harness;

pub use budget::{
    BudgetConfig, LimitsConfig, OPENAI_DEFAULT_ROLE_TOKENS, OPENAI_DEFAULT_TOKENS,
    OPENAI_DEFAULT_WALL_SECS, PriceConfig, budget_lines, openai_default_budgets,
};
pub use migrations::{MigrationsConfig, ToolKind};

/// The configuration file's name at the project root.
pub const CONFIG_FILE: &str = "consort.toml";

/// Why a configuration is unusable.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The directory holds no `consort.toml`: it is not a Consort project (yet).
    #[error(
        "{} is not a Consort project: it has no consort.toml; `consort init {}` starts one (in a repository with code, it detects the stack, its tests and migrations)",
        dir.display(),
        dir.display()
    )]
    NoProject {
        /// The directory.
        dir: PathBuf,
    },
    /// The file could not be read.
    #[error("cannot read {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a key is unknown, or a value has the wrong type.
    #[error("{path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message (it names the key and the line).
        message: String,
    },
    /// A value is out of range or inconsistent.
    #[error("{path}: `{key}`: {message}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// The offending key, dotted.
        key: String,
        /// What is wrong.
        message: String,
    },
}

/// The whole `consort.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProjectConfig {
    /// The feature request this project builds.
    pub feature: FeatureConfig,
    /// Work-tree layout.
    #[serde(default)]
    pub paths: PathsConfig,
    /// The test runner.
    #[serde(default)]
    pub runner: RunnerConfig,
    /// The branch provider.
    #[serde(default)]
    pub database: ProviderConfig,
    /// The warm pool.
    #[serde(default)]
    pub pool: PoolSettings,
    /// The agent backend per role.
    pub agents: AgentsConfig,
    /// Bounds and timeouts.
    #[serde(default)]
    pub bounds: BoundsConfig,
    /// Budgets of the run and its roles, and the price table.
    #[serde(default)]
    pub budget: BudgetConfig,
    /// Where the design's migrations are written, and the project's existing ones.
    #[serde(default)]
    pub migrations: MigrationsConfig,
    /// What `consort mcp` offers its clients.
    #[serde(default)]
    pub mcp: McpSettings,
    /// Where the project's records are kept: files here, or a store machines share.
    #[serde(default)]
    pub store: StoreConfig,
    /// How lanes share code through a git remote.
    #[serde(default)]
    pub git: GitSettings,
    /// The branch under the names the project reads (`DB_HOST = "{host}"`), for the test
    /// command and `consort exec` (see [`consort_lakebase::BranchEnv`]).
    #[serde(default)]
    pub branch_env: std::collections::BTreeMap<String, String>,
}

/// `[store]`: where the project's records (the backlog, each feature's ledger, gate decisions,
/// the lanes' records and who drives what) are kept.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case", deny_unknown_fields)]
pub enum StoreConfig {
    /// Files under `.consort/`, seen by this checkout only (the default).
    #[default]
    Files,
    /// A PostgreSQL database that every machine driving the project names.
    Postgres {
        /// The variable holding the database's URL (default `CONSORT_STORE_URL`).
        #[serde(default = "default_store_url_env")]
        url_env: String,
        /// The name the project's records are kept under (several projects may share one
        /// database).
        project: String,
        /// How long a process's hold on a feature lasts unless renewed, in seconds (default
        /// 30): a process killed or cut off loses its features after this long.
        #[serde(default = "default_lease_seconds")]
        lease_seconds: u64,
    },
}

/// `[git]`: how lanes share code between machines.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GitSettings {
    /// The remote every lane pushes its branch to after each of Consort's commits, fetches
    /// from when it resumes, and whose base its merge check pushes to (None: no remote; the
    /// commits stay in this checkout).
    #[serde(default)]
    pub remote: Option<String>,
}

fn default_store_url_env() -> String {
    "CONSORT_STORE_URL".into()
}
fn default_lease_seconds() -> u64 {
    30
}

/// `[mcp]`: what `consort mcp` offers its clients.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpSettings {
    /// Offer the `approve` tool, which records a gate approval exactly as `consort approve`
    /// does (default: false; approving stays a human's command).
    #[serde(default)]
    pub approve: bool,
}

/// `[feature]`: the request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FeatureConfig {
    /// A stable id such as `F1-stock-visibility`.
    pub id: String,
    /// The request as markdown, relative to the project; its first `# ` line is the title.
    pub request: PathBuf,
}

/// `[paths]`: which paths are tests and which are the harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PathsConfig {
    /// Test-path globs: the Navigator's alone, in RED only.
    pub tests: Vec<String>,
    /// Harness globs: no agent may change them. Consort's own files, version-control metadata
    /// (`.git`, `.hg`, `.svn`, at any depth) and what the runner's configuration reaches (see
    /// [`crate::config::runner_harness`]) are always harness: list here only what that rule cannot see.
    #[serde(default)]
    pub harness: Vec<String>,
    /// Extra cache directory names, added to the defaults (`__pycache__`, `.pytest_cache`,
    /// `target`, `node_modules`, … see `consort_actors::DEFAULT_CACHES`): a directory of
    /// one of these names, at any depth, is never hashed, never taken for test files and never
    /// written by an agent.
    #[serde(default)]
    pub caches: Vec<String>,
}

impl Default for PathsConfig {
    fn default() -> Self {
        PathsConfig {
            tests: vec!["tests/**".into()],
            harness: Vec::new(),
            caches: Vec::new(),
        }
    }
}

/// `[pool]`: warm branches and concurrency.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PoolSettings {
    /// Warm branches kept ready. Lanes split them, and each lane keeps only as many as its
    /// runs took at once (at least one, at most its share).
    #[serde(default = "default_pool")]
    pub size: usize,
    /// Verifications at once.
    #[serde(default = "default_pool")]
    pub max_concurrent: usize,
    /// Keep the branch of a failed run for inspection (for an hour).
    #[serde(default)]
    pub keep_failed: bool,
}

fn default_pool() -> usize {
    4
}

impl Default for PoolSettings {
    fn default() -> Self {
        PoolSettings {
            size: 4,
            max_concurrent: 4,
            keep_failed: false,
        }
    }
}

/// `[database]`: where branches come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "provider", rename_all = "kebab-case", deny_unknown_fields)]
pub enum ProviderConfig {
    /// A private PostgreSQL cluster started from the local server binaries (the default).
    Embedded {
        /// The cluster directory, relative to the project.
        #[serde(default = "default_data_dir")]
        data_dir: PathBuf,
        /// The unprivileged user the server runs as when Consort runs as root.
        #[serde(default = "default_run_as")]
        run_as: String,
        /// Which PostgreSQL runs the cluster: `"auto"` (the default: an installed
        /// PostgreSQL 15 or newer, else Consort's own, fetched once per user), `"fetched"`
        /// (Consort's own even when one is installed), or the directory of `initdb` and
        /// `postgres` (with a `/`; relative to the project).
        #[serde(default)]
        postgres: consort_lakebase::PostgresSource,
        /// Whether branch databases are made in memory (a tablespace on a tmpfs, where the
        /// machine has one Consort may use; the parent and the bases stay on disk). Default
        /// `true`; `false` keeps every branch on disk.
        #[serde(default = "runner::default_true")]
        branches_in_memory: bool,
    },
    /// An existing PostgreSQL server; the URL comes from an environment variable.
    Url {
        /// The variable holding the URL (default `CONSORT_DATABASE_URL`).
        #[serde(default = "default_url_env")]
        url_env: String,
    },
    /// Lakebase Autoscaling: a branch per run from a source branch, over the REST API.
    Lakebase(LakebaseSettings),
}

/// `[database] provider = "lakebase"`: the keys of the Lakebase backend.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LakebaseSettings {
    /// The variable holding the workspace host (default `DATABRICKS_HOST`).
    #[serde(default = "default_host_env")]
    pub host_env: String,
    /// The variable holding the bearer token (default `DATABRICKS_TOKEN`).
    #[serde(default = "default_token_env")]
    pub token_env: String,
    /// The variable holding a service principal's OAuth client id (default
    /// `DATABRICKS_CLIENT_ID`); with the secret's variable set too, OAuth machine-to-machine
    /// is used instead of the bearer token.
    #[serde(default = "default_client_id_env")]
    pub client_id_env: String,
    /// The variable holding the service principal's OAuth client secret (default
    /// `DATABRICKS_CLIENT_SECRET`).
    #[serde(default = "default_client_secret_env")]
    pub client_secret_env: String,
    /// The Lakebase project id.
    pub project: String,
    /// The branch new branches fork from.
    #[serde(default = "default_source_branch")]
    pub source_branch: String,
    /// The Postgres user (default: the token's Databricks identity).
    pub user: Option<String>,
    /// Time to live of each branch, in seconds.
    #[serde(default = "default_ttl")]
    pub ttl_secs: u64,
    /// A PEM file of CA certificates trusted for the branches' TLS beside the web roots,
    /// relative to the project (for a private CA); certificate and host name are always
    /// verified.
    pub ca_file: Option<PathBuf>,
    /// How many branches the project may hold at once (default 10, the service's limit): the
    /// pool keeps its warm branches and concurrent runs within it.
    #[serde(default = "default_max_live_branches")]
    pub max_live_branches: usize,
}

fn default_client_id_env() -> String {
    "DATABRICKS_CLIENT_ID".into()
}
fn default_client_secret_env() -> String {
    "DATABRICKS_CLIENT_SECRET".into()
}
fn default_max_live_branches() -> usize {
    10
}

fn default_data_dir() -> PathBuf {
    PathBuf::from(".consort/pg")
}
fn default_run_as() -> String {
    "postgres".into()
}
fn default_url_env() -> String {
    "CONSORT_DATABASE_URL".into()
}
fn default_host_env() -> String {
    "DATABRICKS_HOST".into()
}
fn default_token_env() -> String {
    "DATABRICKS_TOKEN".into()
}
fn default_source_branch() -> String {
    "production".into()
}
fn default_ttl() -> u64 {
    3600
}

impl Default for ProviderConfig {
    fn default() -> Self {
        ProviderConfig::Embedded {
            data_dir: default_data_dir(),
            run_as: default_run_as(),
            postgres: consort_lakebase::PostgresSource::Auto,
            branches_in_memory: true,
        }
    }
}

/// `[agents]`: the backend for every role, with per-role overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsConfig {
    /// The backend of every role without an override.
    pub default: AgentConfig,
    /// Per-role overrides, keyed by role name (`driver`, `navigator`, …).
    #[serde(default)]
    pub roles: BTreeMap<String, AgentConfig>,
}

impl AgentsConfig {
    /// The backend configured for a role.
    pub fn for_role(&self, role: Role) -> &AgentConfig {
        self.roles.get(role.as_str()).unwrap_or(&self.default)
    }
}

/// `[bounds]`: loop bounds and timeouts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BoundsConfig {
    /// Architect revisions before escalating.
    pub max_revisions: u32,
    /// GREEN repair rounds before escalating.
    pub max_repairs: u32,
    /// Review change requests before escalating.
    pub max_review_rounds: u32,
    /// Refused answers an agent may retry per step.
    pub max_agent_retries: u32,
    /// Deadline of one agent step, in seconds.
    pub step_timeout_secs: u64,
    /// Deadline of one verification, in seconds.
    pub verify_timeout_secs: u64,
    /// Scratch runs a build step's tools may make (0: none; reads, listings and searches
    /// stay). Default 3.
    #[serde(default = "default_scratch_runs")]
    pub scratch_runs: u32,
}

fn default_scratch_runs() -> u32 {
    consort_actors::workbench::WorkbenchLimits::default().runs
}

impl Default for BoundsConfig {
    fn default() -> Self {
        BoundsConfig {
            max_revisions: 2,
            max_repairs: 3,
            max_review_rounds: 2,
            max_agent_retries: 2,
            step_timeout_secs: 600,
            verify_timeout_secs: 900,
            scratch_runs: default_scratch_runs(),
        }
    }
}

impl ProjectConfig {
    /// Reads and checks `<dir>/consort.toml`.
    pub fn load(dir: &Path) -> Result<Self, ConfigError> {
        let path = dir.join(CONFIG_FILE);
        let text = std::fs::read_to_string(&path).map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => ConfigError::NoProject {
                dir: dir.to_path_buf(),
            },
            _ => ConfigError::Read {
                path: path.clone(),
                source,
            },
        })?;
        Self::parse(&text, &path)
    }

    /// Parses and checks configuration text (`path` is for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let cfg: ProjectConfig = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        cfg.check(path)?;
        Ok(cfg)
    }

    /// `[store]` and `[git]`: a shared store's name and lease time, a remote's name.
    fn check_sharing(
        &self,
        invalid: &dyn Fn(&str, String) -> ConfigError,
    ) -> Result<(), ConfigError> {
        if let StoreConfig::Postgres {
            project,
            lease_seconds,
            ..
        } = &self.store
        {
            if project.trim().is_empty() || project.len() > 200 {
                return Err(invalid(
                    "store.project",
                    "name the project in 1 to 200 characters".into(),
                ));
            }
            if !(2..=3600).contains(lease_seconds) {
                return Err(invalid(
                    "store.lease_seconds",
                    "between 2 and 3600 seconds".into(),
                ));
            }
        }
        if let Some(remote) = &self.git.remote
            && (remote.is_empty()
                || remote.starts_with('-')
                || remote.contains(char::is_whitespace))
        {
            return Err(invalid(
                "git.remote",
                "name a git remote, such as `origin`".into(),
            ));
        }
        Ok(())
    }

    fn check(&self, path: &Path) -> Result<(), ConfigError> {
        let invalid = |key: &str, message: String| ConfigError::Invalid {
            path: path.to_path_buf(),
            key: key.into(),
            message,
        };
        if self.feature.id.trim().is_empty() {
            return Err(invalid("feature.id", "must not be empty".into()));
        }
        if self.paths.tests.is_empty() {
            return Err(invalid(
                "paths.tests",
                "name at least one test-path glob".into(),
            ));
        }
        let policy = self
            .path_policy()
            .map_err(|e| invalid("paths", e.to_string()))?;
        let dir = consort_actors::normalise_relative(&self.migrations.dir)
            .map_err(|e| invalid("migrations.dir", e.to_string()))?;
        if dir != self.migrations.dir || dir.contains(['*', '?', '[', '{']) {
            return Err(invalid(
                "migrations.dir",
                format!("write it as a plain relative directory, such as `{dir}`"),
            ));
        }
        self.migrations
            .check()
            .map_err(|(key, message)| invalid(&key, message))?;
        if policy.is_test(&format!("{dir}/0001_S1_x.sql")) {
            return Err(invalid(
                "migrations.dir",
                format!("{dir} lies in the test paths; migrations are no test"),
            ));
        }
        for name in &self.paths.caches {
            TreeFilter::check_name(name).map_err(|e| invalid("paths.caches", e.to_string()))?;
        }
        for name in self.agents.roles.keys() {
            name.parse::<Role>()
                .map_err(|e| invalid(&format!("agents.roles.{name}"), e.to_string()))?;
        }
        self.check_sharing(&invalid)?;
        if self.pool.size > 64 {
            return Err(invalid("pool.size", "at most 64".into()));
        }
        if self.pool.max_concurrent == 0 || self.pool.max_concurrent > 64 {
            return Err(invalid("pool.max_concurrent", "between 1 and 64".into()));
        }
        let (RunnerConfig::Psql { shards, .. } | RunnerConfig::Command { shards, .. }) =
            &self.runner;
        if shards.is_some_and(|n| n == 0 || n > 64) {
            return Err(invalid(
                "runner.shards",
                "between 1 and 64 (1 runs the suite whole)".into(),
            ));
        }
        let b = &self.bounds;
        if b.max_repairs > 20
            || b.max_review_rounds > 20
            || b.max_revisions > 20
            || b.max_agent_retries > 20
        {
            return Err(invalid("bounds", "loop bounds are at most 20".into()));
        }
        if b.step_timeout_secs == 0 || b.verify_timeout_secs == 0 {
            return Err(invalid(
                "bounds",
                "timeouts must be at least 1 second".into(),
            ));
        }
        match &self.runner {
            RunnerConfig::Command { command, .. } if command.trim().is_empty() => {
                return Err(invalid("runner.command", "must not be empty".into()));
            }
            RunnerConfig::Psql { tests, .. } if tests.is_empty() => {
                return Err(invalid("runner.tests", "name at least one glob".into()));
            }
            RunnerConfig::Command { env_set, .. } => {
                check_env_set(env_set).map_err(|m| invalid("runner.env_set", m))?;
            }
            _ => {}
        }
        self.branch_env().map_err(|m| invalid("branch_env", m))?;
        self.budgets(None).map_err(|e| match e {
            ConfigError::Invalid { key, message, .. } => invalid(&key, message),
            other => other,
        })?;
        check_runner(&self.runner, &policy)
            .map_err(|e| invalid(e.key(), consort_actors::error_chain(&e)))
    }

    /// The budgets from `[budget]` and the roles' legacy OpenAI `budget` settings, with
    /// `agents_override` (`--agents openai`) as every role's backend when given.
    pub fn budgets(
        &self,
        agents_override: Option<&AgentConfig>,
    ) -> Result<consort_actors::Budgets, ConfigError> {
        self.budget
            .budgets(|role| {
                agents_override
                    .unwrap_or_else(|| self.agents.for_role(role))
                    .clone()
            })
            .map_err(|(key, message)| ConfigError::Invalid {
                path: PathBuf::from(CONFIG_FILE),
                key,
                message,
            })
    }

    /// The configuration that judges a feature's runs: `[runner]`, `[paths]` and
    /// `[migrations]`, each by the hash of its settings as read (comments and layout do not
    /// count). A change to it while a feature is open is recorded as a person's decision.
    pub fn harness(&self) -> consort_actors::Harness {
        use consort_actors::ContentHash;
        consort_actors::Harness {
            sections: [
                ("runner", ContentHash::of(&self.runner)),
                ("paths", ContentHash::of(&self.paths)),
                ("migrations", ContentHash::of(&self.migrations)),
            ]
            .into_iter()
            .map(|(name, hash)| (name.to_string(), hash))
            .collect(),
        }
    }

    /// `[branch_env]` read: names a shell can export, none of the run's own (`PG*` but the
    /// project's `DATABASE_URL` form, the scratch's, `CONSORT_*`), templates over the branch's
    /// fields only.
    pub fn branch_env(&self) -> Result<consort_lakebase::BranchEnv, String> {
        let own: std::collections::BTreeMap<String, String> = self
            .branch_env
            .iter()
            .filter(|(name, _)| name.as_str() != "DATABASE_URL")
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        check_env_set(&own)?;
        if let Some(name) = own.keys().find(|n| n.starts_with("PG")) {
            return Err(format!(
                "{name} is libpq's own name for the branch's connection, which every run sets itself"
            ));
        }
        consort_lakebase::BranchEnv::parse(&self.branch_env)
    }

    /// The path policy from `[paths]`, with what the runner's configuration makes harness
    /// (see [`crate::config::runner_harness`]): outside the test paths, the files the runner's commands
    /// name and the test tool's configuration; the cache names are added to the defaults.
    pub fn path_policy(&self) -> Result<PathPolicy, consort_actors::GlobError> {
        let tests_only = PathPolicy::new(&self.paths.tests, &[])?;
        let runner = RunnerHarness::of(&self.runner, &tests_only);
        let mut harness = self.paths.harness.clone();
        harness.push(format!("{}/**", self.migrations.dir));
        let policy = PathPolicy::new(&self.paths.tests, &harness)?
            .with_harness_outside_tests(&runner.outside_test_globs())?
            .with_caches(&self.paths.caches)
            .with_test_identity(crate::config::runner_facts::test_identity(self));
        match crate::config::runner_facts::collected(self) {
            Some(globs) => policy.with_collected(&globs),
            None => Ok(policy),
        }
    }

    /// What the runner's configuration makes harness without `[paths] harness` listing it.
    pub fn runner_harness(&self) -> Result<RunnerHarness, consort_actors::GlobError> {
        Ok(RunnerHarness::of(
            &self.runner,
            &PathPolicy::new(&self.paths.tests, &[])?,
        ))
    }

    /// The machine configuration from `[paths]`, `[bounds]` and `[runner] per_step`.
    pub fn machine_config(&self) -> Result<MachineConfig, consort_actors::GlobError> {
        Ok(MachineConfig {
            paths: self.path_policy()?,
            max_revisions: self.bounds.max_revisions,
            max_repairs: self.bounds.max_repairs,
            max_review_rounds: self.bounds.max_review_rounds,
            max_agent_retries: self.bounds.max_agent_retries,
            per_step: self.runner.per_step(),
            migration_files: Some(consort_actors::MigrationFiles {
                dir: self.migrations.dir.clone(),
                apply_existing: self.migrations.apply_existing,
                promote_existing: self.migrations.promote_existing,
                lane: None,
                tool: self.migrations.tool_format(),
            }),
        })
    }

    /// The step deadline.
    pub fn step_timeout(&self) -> Duration {
        Duration::from_secs(self.bounds.step_timeout_secs)
    }

    /// The verification deadline.
    pub fn verify_timeout(&self) -> Duration {
        Duration::from_secs(self.bounds.verify_timeout_secs)
    }

    /// The bounds of the tools build steps get.
    pub fn workbench(&self) -> consort_actors::workbench::WorkbenchLimits {
        consort_actors::workbench::WorkbenchLimits {
            runs: self.bounds.scratch_runs,
            ..consort_actors::workbench::WorkbenchLimits::default()
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The smallest configuration that parses (shared with the runner harness tests).
    pub(crate) const MINIMAL: &str = r#"
[feature]
id = "F1"
request = "feature.md"

[agents.default]
backend = "script"
path = ".consort/script.toml"
"#;

    /// [`MINIMAL`], parsed.
    pub(crate) fn minimal() -> ProjectConfig {
        ProjectConfig::parse(MINIMAL, Path::new("consort.toml")).expect("parses")
    }

    /// [`MINIMAL`] and then `more`, parsed.
    fn minimal_and(more: &str) -> Result<ProjectConfig, ConfigError> {
        ProjectConfig::parse(&format!("{MINIMAL}\n{more}"), Path::new("consort.toml"))
    }

    /// The migration tool's command is part of what judges the runs: changing it while a
    /// feature is open is a person's recorded decision, never a silent one.
    #[test]
    fn the_migration_tool_and_its_command_are_part_of_the_harness() {
        let parse = |migrations: &str| {
            minimal_and(&format!(
                "[migrations]\ndir = \"db/migrations\"\n{migrations}"
            ))
            .expect("parses")
        };
        let dbmate = parse("tool = \"dbmate\"\n");
        let changed = parse("tool = \"dbmate\"\napply = \"dbmate --wait up\"\n");
        assert_eq!(
            changed.harness().changed_from(&dbmate.harness()),
            ["migrations"]
        );
        assert_eq!(
            parse("").harness().changed_from(&dbmate.harness()),
            ["migrations"]
        );
        let machine = dbmate.machine_config().expect("machine");
        let files = machine.migration_files.expect("files");
        assert_eq!(files.tool.map(|t| t.name), Some("dbmate".into()));
        assert!(
            dbmate
                .path_policy()
                .expect("policy")
                .is_harness("db/migrations/x.sql")
        );
    }

    #[test]
    fn branch_env_maps_the_branch_and_refuses_what_a_run_sets_itself() {
        let with = |table: &str| minimal_and(&format!("[branch_env]\n{table}"));
        let c = with("DB_HOST = \"{host}\"\nDATABASE_URL = \"postgresql+psycopg://{user}@{host}/{database}\"\n")
            .expect("parses");
        assert_eq!(c.branch_env.len(), 2);
        for (table, says) in [
            ("PGHOST = \"{host}\"\n", "set by every run"),
            ("PGAPPNAME = \"app\"\n", "libpq's own name"),
            ("HOME = \"/x\"\n", "set by every run"),
            ("CONSORT_X = \"{host}\"\n", "set by every run"),
            ("DB_HOST = \"{hostname}\"\n", "no field of the branch"),
            ("\"1X\" = \"{host}\"\n", "not a variable name"),
        ] {
            let e = with(table).expect_err(table);
            let e = consort_actors::error_chain(&e);
            assert!(e.contains("branch_env") && e.contains(says), "{table}: {e}");
        }
    }

    #[test]
    fn mcp_approval_is_off_unless_configured_and_unknown_keys_are_refused() {
        assert!(!minimal().mcp.approve);
        let on = format!("{MINIMAL}\n[mcp]\napprove = true\n");
        let c = ProjectConfig::parse(&on, Path::new("consort.toml")).expect("parses");
        assert!(c.mcp.approve);
        let err = minimal_and("[mcp]\naprove = true\n").expect_err("refused");
        assert!(err.to_string().contains("aprove"), "{err}");
        let c = minimal_and("[agents.roles.driver]\nbackend = \"mcp\"\n").expect("parses");
        assert!(matches!(
            c.agents.for_role(Role::Driver),
            AgentConfig::Mcp(_)
        ));
        let extra =
            format!("{MINIMAL}\n[agents.roles.driver]\nbackend = \"mcp\"\nprogram = \"x\"\n");
        assert!(ProjectConfig::parse(&extra, Path::new("consort.toml")).is_err());
    }

    #[test]
    fn the_store_is_files_unless_configured_and_a_shared_one_is_checked() {
        assert_eq!(minimal().store, StoreConfig::Files);
        assert_eq!(minimal().git.remote, None);
        let shared = format!(
            "{MINIMAL}\n[store]\nkind = \"postgres\"\nproject = \"shop\"\n[git]\nremote = \"origin\"\n"
        );
        let c = ProjectConfig::parse(&shared, Path::new("consort.toml")).expect("parses");
        assert_eq!(
            c.store,
            StoreConfig::Postgres {
                url_env: "CONSORT_STORE_URL".into(),
                project: "shop".into(),
                lease_seconds: 30,
            }
        );
        assert_eq!(c.git.remote.as_deref(), Some("origin"));
        for (bad, key) in [
            (
                "[store]\nkind = \"postgres\"\nproject = \"\"\n",
                "store.project",
            ),
            (
                "[store]\nkind = \"postgres\"\nproject = \"p\"\nlease_seconds = 1\n",
                "store.lease_seconds",
            ),
            ("[git]\nremote = \"--upload-pack=x\"\n", "git.remote"),
        ] {
            let err = minimal_and(bad).expect_err("refused");
            assert!(err.to_string().contains(key), "{err}");
        }
        let unnamed = format!("{MINIMAL}\n[store]\nkind = \"postgres\"\n");
        let err = ProjectConfig::parse(&unnamed, Path::new("consort.toml")).expect_err("refused");
        assert!(err.to_string().contains("project"), "{err}");
    }

    #[test]
    fn a_minimal_file_gets_the_defaults() {
        let c = ProjectConfig::parse(MINIMAL, Path::new("consort.toml")).expect("parses");
        assert_eq!(c.paths.tests, vec!["tests/**".to_string()]);
        assert!(matches!(c.database, ProviderConfig::Embedded { .. }));
        assert!(matches!(c.runner, RunnerConfig::Psql { .. }));
        assert_eq!(c.bounds.max_repairs, 3);
        assert_eq!(c.workbench().runs, 3, "three scratch runs per build step");
        let none = format!(
            "{MINIMAL}\n[bounds]\nmax_revisions = 2\nmax_repairs = 3\nmax_review_rounds = 2\nmax_agent_retries = 2\nstep_timeout_secs = 600\nverify_timeout_secs = 900\nscratch_runs = 0\n"
        );
        let c = ProjectConfig::parse(&none, Path::new("consort.toml")).expect("parses");
        assert_eq!(c.workbench().runs, 0);
    }

    #[test]
    fn unknown_keys_are_named() {
        let text = format!("{MINIMAL}\n[bounds]\nmax_repairz = 3\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("max_repairz"), "{e}");
        let text = MINIMAL.replace("[feature]", "[feature]\ncolour = \"red\"");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("colour"), "{e}");
    }

    #[test]
    fn env_set_may_not_set_what_every_run_sets() {
        let with = |vars: &str| {
            let text = format!(
                "{MINIMAL}\n[runner]\nkind = \"command\"\ncommand = \"pytest\"\nenv_set = {{ {vars} }}\n"
            );
            ProjectConfig::parse(&text, Path::new("consort.toml"))
        };
        let c = with("APP_MODE = \"test\"").expect("an ordinary variable");
        assert!(
            matches!(&c.runner, RunnerConfig::Command { env_set, .. } if env_set["APP_MODE"] == "test")
        );
        for vars in [
            "PGPASSWORD = \"x\"",
            "DATABASE_URL = \"postgres://elsewhere\"",
            "HOME = \"/root\"",
            "CONSORT_JUNIT = \"j.xml\"",
            "\"1BAD\" = \"x\"",
            "\"A-B\" = \"x\"",
        ] {
            let e = with(vars).expect_err(vars);
            assert!(e.to_string().contains("runner.env_set"), "{vars}: {e}");
        }
    }

    #[test]
    fn the_embedded_postgres_is_auto_fetched_or_a_directory_and_nothing_else() {
        let source = |value: &str| {
            let text =
                format!("{MINIMAL}\n[database]\nprovider = \"embedded\"\npostgres = \"{value}\"\n");
            ProjectConfig::parse(&text, Path::new("consort.toml")).map(|c| match c.database {
                ProviderConfig::Embedded { postgres, .. } => postgres.relative_to(Path::new("/p")),
                _ => panic!("embedded"),
            })
        };
        use consort_lakebase::PostgresSource;
        assert_eq!(source("auto").expect("auto"), PostgresSource::Auto);
        assert_eq!(source("fetched").expect("fetched"), PostgresSource::Fetched);
        assert_eq!(
            source("pg/bin").expect("a directory"),
            PostgresSource::Dir("/p/pg/bin".into())
        );
        assert_eq!(
            source("/opt/pg/bin").expect("a directory"),
            PostgresSource::Dir("/opt/pg/bin".into())
        );
        let e = source("fetch").expect_err("a typo is no directory");
        assert!(e.to_string().contains("\"auto\", \"fetched\""), "{e}");
        assert_eq!(ProviderConfig::default(), {
            let text = format!("{MINIMAL}\n[database]\nprovider = \"embedded\"\n");
            ProjectConfig::parse(&text, Path::new("consort.toml"))
                .expect("parses")
                .database
        });
    }

    #[test]
    fn the_guide_s_coding_agent_cli_examples_parse() {
        let page = include_str!("../docs/guide/src/agents.md");
        let section = page
            .split("## Coding-agent CLIs")
            .nth(1)
            .expect("the guide's agents page has the section");
        let example = section
            .split("```toml\n")
            .nth(1)
            .and_then(|b| b.split("```").next())
            .expect("the section has a TOML example");
        let text = format!("{MINIMAL}\n{example}");
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parses");
        let preset = |role: Role| match c.agents.for_role(role) {
            AgentConfig::Command(cmd) => cmd.preset,
            _ => None,
        };
        use consort_agents::Preset;
        assert_eq!(preset(Role::Driver), Some(Preset::ClaudeCode));
        assert_eq!(preset(Role::Navigator), Some(Preset::Codex));
        assert_eq!(preset(Role::Dba), Some(Preset::Aider));
        let AgentConfig::Command(dba) = c.agents.for_role(Role::Dba) else {
            panic!("a command backend")
        };
        assert_eq!(dba.effective_program(), "aider");
        assert_eq!(dba.pass_env, ["PATH", "HOME"]);
        assert!(dba.env_set.contains_key("OPENAI_API_BASE"));

        let text = format!(
            "{MINIMAL}\n[agents.roles.driver]\nbackend = \"command\"\npreset = \"cursor\"\n"
        );
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("cursor"), "{e}");
        // The old name of `pass_env` is still read.
        let text = format!(
            "{MINIMAL}\n[agents.roles.driver]\nbackend = \"command\"\nprogram = \"x\"\nenv_allow = [\"PATH\"]\n"
        );
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parses");
        assert!(
            matches!(c.agents.for_role(Role::Driver), AgentConfig::Command(cmd) if cmd.pass_env == ["PATH"])
        );
    }

    #[test]
    fn runner_shards_are_bounded_and_default_to_the_cores_and_verifications() {
        let text = format!("{MINIMAL}\n[runner]\nkind = \"psql\"\nshards = 0\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("runner.shards"), "{e}");
        let text =
            format!("{MINIMAL}\n[runner]\nkind = \"psql\"\nshards = 3\nsplit_above_secs = 0\n");
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parsed");
        let shards = c.runner.shards(4);
        assert_eq!((shards.max, shards.split_above_ms), (3, 0));
        let c = ProjectConfig::parse(MINIMAL, Path::new("consort.toml")).expect("parsed");
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let shards = c.runner.shards(4);
        assert_eq!(shards.max, 4.min(cores));
        assert_eq!(
            shards.split_above_ms,
            consort_lakebase::Shards::SPLIT_ABOVE_MS
        );
    }

    #[test]
    fn bad_values_are_named() {
        let text = format!("{MINIMAL}\n[pool]\nmax_concurrent = 0\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("pool.max_concurrent"), "{e}");
        let text = format!("{MINIMAL}\n[database]\nprovider = \"embedded\"\nusr = \"x\"\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("usr"), "{e}");
        let text = format!("{MINIMAL}\n[agents.roles.drivr]\nbackend = \"script\"\npath = \"x\"\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("drivr"), "{e}");
        let text = format!("{MINIMAL}\n[database]\nprovider = \"oracle\"\n");
        assert!(ProjectConfig::parse(&text, Path::new("consort.toml")).is_err());
        let text = format!("{MINIMAL}\n[paths]\ntests = [\"tests/[x\"]\n");
        assert!(ProjectConfig::parse(&text, Path::new("consort.toml")).is_err());
        let text =
            format!("{MINIMAL}\n[paths]\ntests = [\"tests/**\"]\ncaches = [\"out/build\"]\n");
        let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err("refused");
        assert!(e.to_string().contains("paths.caches"), "{e}");
    }

    #[test]
    fn the_migrations_directory_is_harness_and_must_be_a_plain_directory() {
        let c = ProjectConfig::parse(MINIMAL, Path::new("consort.toml")).expect("parses");
        let policy = c.path_policy().expect("policy");
        assert!(policy.is_harness("migrations/0001_S1_stock.sql"));
        assert!(policy.is_harness("migrations/V1__existing.sql"));
        let files = c.machine_config().expect("machine").migration_files;
        assert_eq!(files.map(|f| f.dir), Some("migrations".to_string()));
        for (dir, why) in [
            ("../elsewhere", "migrations.dir"),
            ("/abs", "migrations.dir"),
            ("db/./m", "plain relative"),
            ("m*", "plain relative"),
            ("tests/migrations", "test paths"),
        ] {
            let text = format!("{MINIMAL}\n[migrations]\ndir = {dir:?}\n");
            let e = ProjectConfig::parse(&text, Path::new("consort.toml")).expect_err(dir);
            assert!(e.to_string().contains(why), "{dir}: {e}");
        }
        let text =
            format!("{MINIMAL}\n[migrations]\ndir = \"db/migrations\"\napply_existing = false\n");
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parses");
        assert!(
            c.path_policy()
                .expect("policy")
                .is_harness("db/migrations/x.sql")
        );
        assert!(!c.migrations.apply_existing);
    }

    #[test]
    fn extra_cache_names_join_the_defaults() {
        let text = format!(
            "{MINIMAL}\n[paths]\ntests = [\"tests/**\"]\ncaches = [\"build\", \".cache\"]\n"
        );
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parses");
        let policy = c.path_policy().expect("policy");
        let filter = policy.tree_filter();
        assert_eq!(filter.extra(), ["build".to_string(), ".cache".to_string()]);
        assert!(filter.skips("build") && filter.skips("__pycache__") && filter.skips(".git"));
        assert!(!policy.is_test("tests/build/t1.sql"));
        assert!(policy.is_harness(".git/config"));
        let m = c.machine_config().expect("machine");
        assert_eq!(m.paths.tree_filter(), filter);
    }

    #[test]
    fn providers_and_runners_parse() {
        let text = format!(
            "{MINIMAL}\n[database]\nprovider = \"lakebase\"\nproject = \"p\"\nuser = \"me@x\"\n\n[runner]\nkind = \"command\"\ncommand = \"cargo test\"\njunit = \"target/junit.xml\"\n"
        );
        let c = ProjectConfig::parse(&text, Path::new("consort.toml")).expect("parses");
        assert!(
            matches!(&c.database, ProviderConfig::Lakebase(l) if l.project == "p" && l.token_env == "DATABRICKS_TOKEN" && l.max_live_branches == 10 && l.ca_file.is_none())
        );
        assert!(
            c.path_policy().expect("policy").is_harness("Cargo.toml"),
            "cargo's manifest is harness for a cargo command"
        );
    }
}
