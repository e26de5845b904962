//! `consort init` (a commented `consort.toml`, `.consort/`, optionally the StockFlow example),
//! `consort doctor`, and the OpenAI-compatible backend from environment variables.

use std::path::{Path, PathBuf};

use consort_agents::{AgentConfig, OpenAiConfig};

use consort::config::{CONFIG_FILE, ProjectConfig, ProviderConfig, RunnerConfig};

/// Environment variable: the base URL of an OpenAI-compatible server (with `/v1`).
pub const ENV_OPENAI_BASE_URL: &str = "CONSORT_OPENAI_BASE_URL";
/// Environment variable: the model name.
pub const ENV_OPENAI_MODEL: &str = "CONSORT_OPENAI_MODEL";
/// Environment variable holding the API key (its *name* is what the config stores).
pub const ENV_OPENAI_API_KEY: &str = "CONSORT_OPENAI_API_KEY";
/// Environment variable (optional): the completion token limit of every call.
pub const ENV_OPENAI_MAX_TOKENS: &str = "CONSORT_OPENAI_MAX_TOKENS";
/// Environment variable (optional): the model's context window in tokens; unset, it is read
/// from the server where it says (llama.cpp's `/props`).
pub const ENV_OPENAI_CONTEXT_TOKENS: &str = "CONSORT_OPENAI_CONTEXT_TOKENS";

/// Examples `consort init` can write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Example {
    /// StockFlow: warehouse stock by SKU and location, on the psql runner.
    Stockflow,
}

/// The StockFlow feature request.
pub const STOCKFLOW_FEATURE: &str = include_str!("../examples/stockflow/data/feature.md");
/// The StockFlow agent script (every role's answers).
pub const STOCKFLOW_SCRIPT: &str = include_str!("../examples/stockflow/data/script.toml");
/// The StockFlow feature id.
pub const STOCKFLOW_FEATURE_ID: &str = "F1-warehouse-stock";

/// Where `consort init --example stockflow` puts the script.
pub const STOCKFLOW_SCRIPT_PATH: &str = ".consort/agents/stockflow.toml";

/// Where `consort init` (without an example) puts the script skeleton.
pub const SCRIPT_PATH: &str = ".consort/agents/script.toml";

/// The starter agent script `consort init` writes: one entry per design step, every field
/// with a placeholder ([`consort_agents::script_skeleton`], from the artifact schemas).
pub fn script_template() -> String {
    consort_agents::script_skeleton()
}

/// A commented `consort.toml` for a feature request at `feature.md` and a scripted ensemble.
pub fn config_template(feature_id: &str, script: &str) -> String {
    config_for(feature_id, script, &crate::adopt::Layout::default())
}

/// A commented `consort.toml` for a feature request at `feature.md`, a scripted ensemble and
/// the project's layout (its tests, runner and migrations).
pub fn config_for(feature_id: &str, script: &str, layout: &crate::adopt::Layout) -> String {
    let tests = crate::adopt::toml_list(&layout.tests);
    let runner = layout.runner.trim_end();
    let migrations = layout.migrations.trim_end();
    let branch_env = match layout.branch_env.trim_end() {
        "" => String::new(),
        section => format!("\n\n{section}"),
    };
    format!(
        r#"# Consort project configuration. Unknown keys are errors; secrets never go here,
# only the names of the environment variables that hold them.

[feature]
id = "{feature_id}"            # a stable id for the feature
request = "feature.md"          # the request, as markdown; its first '# ' line is the title

[paths]
tests = {tests}            # test paths: written by the Navigator, in RED only
harness = []                    # more files no agent may change; the scripts the runner's
                                # commands name and the test tool's configuration are added
                                # (`consort doctor` lists them); consort.toml, .consort/ and
                                # .git/.hg/.svn always
caches = []                     # extra cache directory names, matched at any depth, on top of
                                # __pycache__ .pytest_cache .mypy_cache .ruff_cache .hypothesis
                                # .tox .nox .venv target node_modules .gradle .next .turbo:
                                # never hashed, never tests, never written by an agent

{runner}

{migrations}{branch_env}

[database]
provider = "embedded"           # a private PostgreSQL cluster, started by consort
data_dir = ".consort/pg"
run_as = "postgres"             # the server's user when consort runs as root
# postgres = "auto"             # an installed PostgreSQL 15+, else consort's own (fetched once);
                                #   "fetched": consort's own; or the path of initdb's directory
# branches_in_memory = false    # branch databases on disk, not in memory (a tmpfs) as by default
# provider = "url"              # an existing server: the URL is read from url_env
# url_env = "CONSORT_DATABASE_URL"
# provider = "lakebase"         # Lakebase Autoscaling over its REST API
# project = "my-project"
# source_branch = "production"
# host_env = "DATABRICKS_HOST"
# token_env = "DATABRICKS_TOKEN"
# ttl_secs = 3600

[pool]
size = 4                        # warm branches kept ready
max_concurrent = 4              # verifications at once
keep_failed = false             # keep a failed run's branch for an hour, to inspect it

[agents.default]                # the backend of every role without an override
backend = "script"
path = "{script}"

# [agents.roles.driver]         # an OpenAI-compatible model for one role
# backend = "openai"
# base_url = "http://127.0.0.1:8000/v1"
# model = "my-model"
# api_key_env = "CONSORT_OPENAI_API_KEY"
#
# [agents.roles.navigator]      # or an external program, run in a scratch copy
# backend = "command"
# program = "./agents/navigator.sh"
#                               # or a coding-agent CLI: preset = "claude-code", "codex" or
#                               # "aider", with its key in pass_env (guide: Coding-agent CLIs)
#                               # or a coding client through `consort mcp`: backend = "mcp"

[bounds]
max_revisions = 2               # architect revise verdicts before escalating
max_repairs = 3                 # GREEN repair rounds before escalating
max_review_rounds = 2           # review change requests before escalating
max_agent_retries = 2           # refused answers an agent may retry per step
step_timeout_secs = 600
verify_timeout_secs = 900
scratch_runs = 3                # scratch runs a build step's tools may make (0: none)

# [mcp]
# approve = false               # offer MCP clients (`consort mcp`) a tool that approves gates
"#
    )
}

/// Why `consort init` failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InitError {
    /// The configuration exists and `--force` was not given.
    #[error("{0} exists; pass --force to overwrite it")]
    Exists(PathBuf),
    /// A file could not be written.
    #[error("cannot write {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One file `consort init` writes, or keeps because it is there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedFile {
    /// Where.
    pub path: PathBuf,
    /// What it would hold.
    pub text: String,
    /// It exists and is left as it is (`consort init` never overwrites a file but
    /// `consort.toml`, and that only with `--force`).
    pub kept: bool,
}

/// What `consort init` writes into a directory, and what it found there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InitPlan {
    /// The files, `consort.toml` first.
    pub files: Vec<PlannedFile>,
    /// What it found (the stack, existing migrations, …), a line each.
    pub notes: Vec<String>,
}

/// What `consort init` would write into `dir`: for an example its files; otherwise a
/// `consort.toml` for what the directory already holds ([`crate::adopt::detect`]), a script
/// skeleton and a feature request, each only where no file is.
pub fn plan(dir: &Path, example: Option<Example>) -> InitPlan {
    let (layout, files): (crate::adopt::Layout, Vec<(&str, String)>) = match example {
        Some(Example::Stockflow) => (
            crate::adopt::Layout::default(),
            vec![
                (
                    CONFIG_FILE,
                    config_template(STOCKFLOW_FEATURE_ID, STOCKFLOW_SCRIPT_PATH),
                ),
                ("feature.md", STOCKFLOW_FEATURE.into()),
                (STOCKFLOW_SCRIPT_PATH, STOCKFLOW_SCRIPT.into()),
            ],
        ),
        None => {
            let layout = crate::adopt::detect(dir);
            let config = config_for("F1", SCRIPT_PATH, &layout);
            (
                layout,
                vec![
                    (CONFIG_FILE, config),
                    (SCRIPT_PATH, script_template()),
                    ("feature.md", PLACEHOLDER_REQUEST.into()),
                ],
            )
        }
    };
    InitPlan {
        files: files
            .into_iter()
            .map(|(rel, text)| PlannedFile {
                kept: dir.join(rel).exists(),
                path: dir.join(rel),
                text,
            })
            .collect(),
        notes: layout.notes,
    }
}

/// Writes what [`plan`] says into `dir`, and `.consort/` (ignored by git); returns the files
/// written. An existing `consort.toml` is an error unless `force`; every other existing file
/// is kept.
pub fn init(dir: &Path, example: Option<Example>, force: bool) -> Result<Vec<PathBuf>, InitError> {
    let config = dir.join(CONFIG_FILE);
    if config.exists() && !force {
        return Err(InitError::Exists(config));
    }
    let mut written = Vec::new();
    for file in plan(dir, example).files {
        if file.kept && file.path != config {
            continue;
        }
        let io = |source| InitError::Io {
            path: file.path.clone(),
            source,
        };
        if let Some(parent) = file.path.parent() {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        std::fs::write(&file.path, &file.text).map_err(io)?;
        written.push(file.path);
    }
    consort::git::keep_state_out_of_git(dir).map_err(|source| InitError::Io {
        path: dir.join(consort_actors::STATE_DIR).join(".gitignore"),
        source,
    })?;
    Ok(written)
}

/// The OpenAI-compatible backend for every role, from `CONSORT_OPENAI_BASE_URL`,
/// `CONSORT_OPENAI_MODEL` and the key in `CONSORT_OPENAI_API_KEY`, with the token limit and
/// context window from `CONSORT_OPENAI_MAX_TOKENS` and `CONSORT_OPENAI_CONTEXT_TOKENS` when
/// they are set.
pub fn openai_from_env() -> Result<AgentConfig, consort::ProjectError> {
    let base = std::env::var(ENV_OPENAI_BASE_URL)
        .map_err(|_| consort::ProjectError::MissingEnv(ENV_OPENAI_BASE_URL.into()))?;
    let model = std::env::var(ENV_OPENAI_MODEL)
        .map_err(|_| consort::ProjectError::MissingEnv(ENV_OPENAI_MODEL.into()))?;
    let mut cfg = OpenAiConfig::new(base, model);
    cfg.api_key_env = Some(ENV_OPENAI_API_KEY.into());
    let var = |name: &str| std::env::var(name).ok();
    cfg.max_tokens = token_count(ENV_OPENAI_MAX_TOKENS, var(ENV_OPENAI_MAX_TOKENS))?;
    cfg.context_tokens = token_count(ENV_OPENAI_CONTEXT_TOKENS, var(ENV_OPENAI_CONTEXT_TOKENS))?;
    Ok(AgentConfig::Openai(cfg))
}

/// A count of tokens from the variable `var`: none when unset or empty, else a whole number
/// above 0.
fn token_count(var: &str, value: Option<String>) -> Result<Option<u32>, consort::ProjectError> {
    let Some(value) = value.filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    match value.trim().replace('_', "").parse::<u32>() {
        Ok(n) if n > 0 => Ok(Some(n)),
        _ => Err(consort::ProjectError::BadEnv {
            var: var.to_string(),
            value,
            expected: "a whole number of tokens above 0",
        }),
    }
}

/// The JUnit report path when the runner's command names it as a file of the work tree: the
/// command would write it there, but a confined run can write only its report directory.
pub fn junit_written_into_tree(config: &ProjectConfig) -> Option<String> {
    let RunnerConfig::Command { junit: Some(j), .. } = &config.runner else {
        return None;
    };
    let j = j.to_string_lossy();
    let j = j.trim_start_matches("./");
    let harness = config.runner_harness().ok()?;
    harness
        .files
        .iter()
        .any(|f| !f.script && f.path == j)
        .then(|| j.to_string())
}

/// The lines `consort doctor` prints about what the runner's configuration makes harness (see
/// [`consort::config::runner_harness`]), so the user sees what no agent may change.
pub fn runner_harness_report(config: &ProjectConfig) -> Vec<String> {
    let Ok(harness) = config.runner_harness() else {
        return Vec::new();
    };
    let listed = harness.describe();
    let mut out = Vec::new();
    if listed.is_empty() {
        out.push(match &config.runner {
            RunnerConfig::Psql { .. } => {
                "ok    harness from [runner]: none (the psql runner reads no configuration file)"
                    .to_string()
            }
            RunnerConfig::Command { .. } => {
                "ok    harness from [runner]: none found; list the command's scripts in [paths] harness"
                    .to_string()
            }
        });
    } else {
        out.push("ok    harness from [runner] (no agent may change these):".to_string());
        out.extend(listed.into_iter().map(|l| format!("        {l}")));
    }
    for u in &harness.unseen {
        out.push(format!(
            "note  {} runs {}, which Consort cannot follow: list that script in [paths] harness",
            u.key, u.path
        ));
    }
    out
}

/// The checks `consort doctor` has printed so far, and whether one failed.
#[derive(Debug, Default)]
struct Checks {
    failed: bool,
}

impl Checks {
    /// Prints one check; a failed one with its fix hint.
    fn report(&mut self, ok: bool, what: &str, hint: &str) {
        if ok {
            println!("ok    {what}");
        } else {
            self.failed = true;
            println!("FAIL  {what}\n      fix: {hint}");
        }
    }
}

/// The feature request `consort init` writes in a new project, for its owner to replace.
pub const PLACEHOLDER_REQUEST: &str =
    "# My feature\n\nDescribe the need, the behaviours, the rules and the scope.\n";
/// The placeholder's body line (a request that still holds it was not written yet).
const PLACEHOLDER_BODY: &str = "Describe the need, the behaviours, the rules and the scope.";

/// What is wrong with a feature request's text, if anything: no `# Title` line, nothing
/// after it, or still the placeholder `consort init` wrote.
pub fn request_problem(text: &str) -> Option<&'static str> {
    let title = consort::backlog::title_of(text).map(str::trim);
    let body_words = text
        .lines()
        .filter(|l| !l.starts_with("# "))
        .any(|l| !l.trim().is_empty());
    if text.contains(PLACEHOLDER_BODY) || title == Some("My feature") {
        Some("is still the placeholder `consort init` wrote: describe the feature you want built")
    } else if title.is_none_or(str::is_empty) {
        Some("has no '# Title' line")
    } else if !body_words {
        Some(
            "has a title and nothing else: describe the need, the behaviours, the rules and the scope",
        )
    } else {
        None
    }
}

/// `consort doctor`: checks the machine and the project; prints each check with a fix hint.
/// With `baseline`, also the whole suite as a feature's baseline runs it (see
/// [`crate::trial::baseline`]). Returns 0 when everything needed is in place, 1 otherwise.
pub fn doctor(dir: &Path, baseline: bool) -> i32 {
    let mut checks = Checks::default();
    let config = ProjectConfig::load(dir);
    check_postgres_binaries(&mut checks, dir, config.as_ref().ok());
    note_orphaned_clusters();
    check_sandbox(&mut checks, config.as_ref().ok());
    checks.report(
        config.is_ok(),
        &match &config {
            Ok(_) => format!("{} parses", dir.join(CONFIG_FILE).display()),
            Err(e) => format!("configuration: {}", consort_actors::error_chain(e)),
        },
        "run `consort init` or fix the key named above",
    );
    let Ok(config) = config else { return 1 };
    check_runner(&mut checks, dir, &config);
    check_migration_names(&mut checks, dir);
    check_database(&mut checks, dir, &config);
    // When the runner and the database are sound: one test file run as a verification runs it.
    if !checks.failed {
        for f in crate::trial::check(dir) {
            checks.report(f.ok, &f.what, &f.hint);
        }
        // On demand: the whole suite, as a feature's baseline runs it.
        if baseline {
            for f in crate::trial::baseline(dir) {
                checks.report(f.ok, &f.what, &f.hint);
            }
        }
    }
    check_request(&mut checks, &dir.join(&config.feature.request));
    check_agents(&mut checks, dir, &config);
    i32::from(checks.failed)
}

/// The project's own migration tool, noted when found (Knex, Alembic, Django: see
/// [`crate::migration_tools`]); the migration files' numbers: one width, so that a text sort (what most migration scripts
/// do) orders them, and the design's versions can follow them.
fn check_migration_names(checks: &mut Checks, dir: &Path) {
    for tool in crate::migration_tools::detect(dir) {
        println!("note  {}", tool.note());
    }
    let Ok(project) = consort::project::Project::open(dir) else {
        return;
    };
    let shown = &project.config.migrations.dir;
    match project.migration_numbering() {
        Ok(Some(n)) => checks.report(
            true,
            &format!(
                "the migration files in {shown}/ are numbered with {} digits (the last: {}); the design's versions follow them",
                n.width, n.example
            ),
            "",
        ),
        Ok(None) => {}
        Err(why) => println!(
            "note  {shown}/: {why}; rename them to one width (`001_`, `010_`), or the design's versions follow no form"
        ),
    }
}

/// The feature request: there, with a title and a body, and not the placeholder.
fn check_request(checks: &mut Checks, path: &Path) {
    let shown = path.display();
    let problem = match std::fs::read_to_string(path) {
        Ok(text) => request_problem(&text).map(str::to_string),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Some("is missing".into()),
        Err(e) => Some(format!("cannot be read: {e}")),
    };
    checks.report(
        problem.is_none(),
        &match &problem {
            None => format!("feature request {shown}"),
            Some(p) => format!("feature request {shown} {p}"),
        },
        "write the feature request as markdown: a '# Title' line, then the need, the behaviours, the rules and the scope",
    );
}

/// A hint (never a failure) when cluster directories placed outside their projects
/// (`/tmp/consort-pg-*`) belong to projects that no longer exist.
fn note_orphaned_clusters() {
    let orphans: Vec<_> = consort_lakebase::placed_clusters()
        .into_iter()
        .filter(|c| c.state == consort_lakebase::Placement::Orphaned)
        .collect();
    if orphans.is_empty() {
        return;
    }
    let bytes: u64 = orphans.iter().map(|c| c.bytes).sum();
    let what = if orphans.len() == 1 {
        "cluster directory under /tmp belongs to a project that no longer exists"
    } else {
        "cluster directories under /tmp belong to projects that no longer exist"
    };
    println!(
        "note  {} {what} ({})\n      fix: consort branches --sweep",
        orphans.len(),
        crate::ui::bytes_text(bytes)
    );
}

/// Which PostgreSQL the project's embedded cluster gets and why (an installed one, the
/// configured directory, or Consort's own, fetched once), and the psql client (a project on
/// another backend needs no server binaries here).
fn check_postgres_binaries(checks: &mut Checks, dir: &Path, config: Option<&ProjectConfig>) {
    let source = match config.map(|c| &c.database) {
        Some(ProviderConfig::Embedded { postgres, .. }) => Some(postgres.relative_to(dir)),
        Some(_) => None,
        None => Some(consort_lakebase::PostgresSource::Auto),
    };
    let mut fetched = false;
    if let Some(source) = source {
        let choice = source.choice();
        fetched = matches!(choice, Ok(consort_lakebase::ServerChoice::ToFetch { .. }));
        checks.report(
            choice.is_ok(),
            &match &choice {
                Ok(c) => c.to_string(),
                Err(e) => format!("PostgreSQL: {}", consort_actors::error_chain(e)),
            },
            "install PostgreSQL 15 or newer (`apt-get install postgresql`), or set `[database] postgres` to the directory of its initdb and postgres",
        );
    }
    let psql = consort_lakebase::find_psql();
    checks.report(
        psql.is_ok() || fetched,
        &match &psql {
            Ok(p) => format!("psql client ({})", p.display()),
            Err(_) if fetched => "psql client: comes with Consort's own PostgreSQL".into(),
            Err(_) => "psql client".into(),
        },
        "apt-get install postgresql-client",
    );
}

/// Test-run confinement: available, or switched off by the configuration.
fn check_sandbox(checks: &mut Checks, config: Option<&ProjectConfig>) {
    let sandbox = consort_lakebase::SandboxSupport::probe();
    let sandbox_off =
        config.is_some_and(|c| c.runner.sandbox() == consort_lakebase::SandboxMode::Off);
    checks.report(
        sandbox_off || matches!(sandbox, consort_lakebase::SandboxSupport::Available { .. }),
        &format!(
            "test-run confinement: {sandbox}{}",
            if sandbox_off {
                " (switched off: sandbox = \"off\")"
            } else {
                ""
            }
        ),
        "use a Linux kernel with Landlock enabled (5.13+; 6.7+ for TCP rules), or set sandbox = \"off\" under [runner]",
    );
}

/// The runner's harness files, its program and what it collects, and where a command
/// runner's JUnit report goes.
fn check_runner(checks: &mut Checks, dir: &Path, config: &ProjectConfig) {
    for line in runner_harness_report(config) {
        println!("{line}");
    }
    let findings = crate::collect::check(dir, config);
    for f in &findings {
        checks.report(f.ok, &f.what, &f.hint);
    }
    if findings.iter().all(|f| f.ok) && matches!(config.runner, RunnerConfig::Command { .. }) {
        check_runner_in_a_lane(checks, dir, config);
    }
    note_editable_installs(dir);
    if let RunnerConfig::Command { junit: Some(j), .. } = &config.runner {
        checks.report(
            junit_written_into_tree(config).is_none(),
            &format!(
                "the JUnit report {} goes to the run's report directory ($CONSORT_JUNIT)",
                j.display()
            ),
            "the command writes it into the work tree, which a confined run cannot write: write it to \"$CONSORT_JUNIT\" (for example --junitxml=\"$CONSORT_JUNIT\")",
        );
    }
}

/// The test command in a scratch lane (a lane is a git worktree, with the dependency
/// directories installed in the project's tree linked into it): it finds its program and
/// collects there too, or `consort run --parallel` would halt at the first run.
fn check_runner_in_a_lane(checks: &mut Checks, dir: &Path, config: &ProjectConfig) {
    match crate::collect::check_in_a_lane(dir, config) {
        None => {}
        Some(Ok(findings)) => {
            for f in findings {
                checks.report(
                    f.ok,
                    &f.what,
                    &format!(
                        "{}; a lane has the project's committed files and links to the dependency directories installed in its tree (node_modules, .venv): commit what the tests need, install the dependencies in the project's tree",
                        f.hint
                    ),
                );
            }
        }
        Some(Err(e)) => checks.report(
            false,
            &format!("a lane's workspace could not be made: {e}"),
            "lanes are git worktrees beside the repository (<repository>.consort-lanes/): its parent directory must be writable",
        ),
    }
}

/// Editable installs of the project in its `.venv`, which every lane links in: they point at
/// the project's tree, so a lane's tests would import the tree's code instead of the lane's.
fn note_editable_installs(dir: &Path) {
    let top = consort::git::GitRepo::detect(dir).map_or_else(|| dir.to_path_buf(), |r| r.top());
    let found = consort::lanes::editable_installs(&top);
    if found.is_empty() {
        return;
    }
    println!(
        "note  the .venv holds an editable install that points into the project's tree ({}): in a lane (consort run --parallel N) the tests would import the project tree's code, not the lane's\n      fix: put the tree's code first on the tests' path (pytest: pythonpath = [\"src\"] under [tool.pytest.ini_options]), or install the project without -e",
        found.join(", ")
    );
}

/// Each role's agent: its scripts parse and are explained (see [`crate::script_check`]), its
/// API key is set, its command is named.
fn check_agents(checks: &mut Checks, dir: &Path, config: &ProjectConfig) {
    for finding in crate::script_check::script_report(dir, config) {
        if finding.is_failure() {
            checks.failed = true;
        }
        println!("{finding}");
    }
    let mut servers = std::collections::BTreeSet::new();
    for role in consort_actors::Role::ALL {
        match config.agents.for_role(role) {
            AgentConfig::Script { .. } => {}
            AgentConfig::Openai(c) => {
                let key = c
                    .api_key_env
                    .as_deref()
                    .is_none_or(|k| std::env::var(k).is_ok());
                checks.report(
                    key,
                    &format!(
                        "{role}: OpenAI-compatible model {} at {}",
                        c.model, c.base_url
                    ),
                    &format!(
                        "export {}",
                        c.api_key_env.as_deref().unwrap_or(ENV_OPENAI_API_KEY)
                    ),
                );
                if servers.insert((c.base_url.clone(), c.model.clone())) {
                    check_model_server(checks, c);
                }
            }
            AgentConfig::Command(c) => {
                let program = c.effective_program();
                let ok = !program.trim().is_empty();
                let what = match c.preset {
                    Some(p) => format!("{role}: coding-agent CLI {p} ({program})"),
                    None => format!("{role}: external command {program}"),
                };
                checks.report(ok, &what, "set `program` or `preset`");
            }
            AgentConfig::Mcp(_) => checks.report(
                true,
                &format!(
                    "{role}: played through `consort mcp` (its assignments wait for an MCP client)"
                ),
                "",
            ),
        }
    }
}

/// Asks an OpenAI-compatible server whether it answers, lists the configured model, and how
/// large its context window is.
fn check_model_server(checks: &mut Checks, c: &consort_agents::OpenAiConfig) {
    let key = c.api_key_env.as_deref().and_then(|k| std::env::var(k).ok());
    // Its own runtime on its own thread: doctor may be called from within a runtime.
    let config = c.clone();
    let asked = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        Some(rt.block_on(consort_agents::openai::check_server(
            &config,
            key.as_deref(),
        )))
    })
    .join();
    let Ok(Some(found)) = asked else {
        checks.report(
            false,
            "model server check",
            "the check could not run; run doctor again",
        );
        return;
    };
    let base = c.base_url.trim_end_matches('/');
    let models = match found.models {
        Ok(m) => m,
        Err(why) => {
            let hint = "start the server, or correct base_url (it includes /v1)";
            checks.report(false, &format!("model server {base}: {why}"), hint);
            return;
        }
    };
    let listed = models.contains(&c.model);
    let shown: Vec<&str> = models.iter().take(8).map(String::as_str).collect();
    checks.report(
        listed,
        &format!("model server {base} answers and lists {}", c.model),
        &format!("set model to one it lists: {}", shown.join(", ")),
    );
    match (found.context_tokens, found.context_configured) {
        (Some(n), true) => println!(
            "ok    context window of {}: {n} tokens (configured)",
            c.model
        ),
        (Some(n), false) => println!(
            "ok    context window of {}: {n} tokens (the server says)",
            c.model
        ),
        (None, _) => println!(
            "note  the server does not say its context window: set context_tokens so prompts are fitted before they are sent"
        ),
    }
}

/// The database provider's environment: the Lakebase host and token, or the database URL.
fn check_database(checks: &mut Checks, dir: &Path, config: &ProjectConfig) {
    if let ProviderConfig::Lakebase(l) = &config.database {
        let set = |name: &str| std::env::var(name).is_ok_and(|v| !v.trim().is_empty());
        checks.report(
            set(&l.host_env),
            &format!("Lakebase host in {}", l.host_env),
            &format!("export {}=https://<workspace>", l.host_env),
        );
        let oauth = set(&l.client_id_env) && set(&l.client_secret_env);
        let what = if oauth {
            format!(
                "Lakebase service principal in {} and {} (OAuth)",
                l.client_id_env, l.client_secret_env
            )
        } else {
            format!("Lakebase token in {}", l.token_env)
        };
        checks.report(
            oauth || set(&l.token_env),
            &what,
            &format!(
                "export {}=<token>, or {} and {} for a service principal",
                l.token_env, l.client_id_env, l.client_secret_env
            ),
        );
        if let Some(ca) = &l.ca_file {
            checks.report(
                dir.join(ca).is_file(),
                &format!("Lakebase CA file {}", ca.display()),
                "ca_file must name a PEM file of CA certificates, relative to the project",
            );
        }
    }
    if let ProviderConfig::Url { url_env } = &config.database {
        let url = std::env::var(url_env).ok();
        checks.report(
            url.is_some(),
            &format!("database URL in {url_env}"),
            &format!("export {url_env}=postgres://…"),
        );
        if let Some(url) = url {
            check_parent_privileges(checks, url);
        }
    }
}

/// Connects to the server a URL names and checks what migrations need of its parent database
/// (see [`consort_lakebase::ServerProvider::parent_privileges`]); a missing privilege fails
/// with the statement that grants it.
fn check_parent_privileges(checks: &mut Checks, url: String) {
    let asked = crate::trial::on_a_thread_of_its_own(move || async move {
        let url = consort_lakebase::Secret::new(url);
        let server = consort_lakebase::PostgresUrlProvider::connect(
            &url,
            consort_lakebase::ServerOptions::default(),
        )
        .await
        .map_err(|e| consort_actors::error_chain(&e))?;
        server
            .parent_privileges()
            .await
            .map_err(|e| consort_actors::error_chain(&e))
    });
    match asked {
        Ok(Ok(found)) => {
            for p in found {
                checks.report(
                    p.ok,
                    &p.what,
                    &format!("as the parent's owner: {}", p.grant),
                );
            }
        }
        Ok(Err(e)) => checks.report(
            false,
            &format!("the database server: {e}"),
            "check the URL, and that the server is up",
        ),
        Err(_) => checks.report(
            false,
            "the database server check failed",
            "run doctor again",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_with_runner(runner: &str) -> ProjectConfig {
        let text = config_template("F1", SCRIPT_PATH).replace(
            "kind = \"psql\"                   # \"psql\": each tests/*.sql file with psql on a fresh branch\nsetup = [\"src/**/*.sql\"]        # code loaded into the branch before the tests\ntests = [\"tests/**/*.sql\"]\n",
            runner,
        );
        ProjectConfig::parse(&text, Path::new(CONFIG_FILE)).expect("loads")
    }

    #[test]
    fn the_example_and_the_fixtures_still_load() {
        use consort::config::runner_harness::RunnerHarness;
        let c = ProjectConfig::parse(
            &config_template(STOCKFLOW_FEATURE_ID, STOCKFLOW_SCRIPT_PATH),
            Path::new("consort.toml"),
        )
        .expect("the StockFlow template loads");
        assert_eq!(
            c.runner_harness().expect("harness"),
            RunnerHarness::default()
        );
        ProjectConfig::parse(
            include_str!("../tests/fixtures/reliability/consort.toml"),
            Path::new("consort.toml"),
        )
        .expect("the reliability fixture loads");
    }

    #[test]
    fn the_template_loads_and_doctor_says_the_psql_runner_adds_nothing() {
        let c = config_with_runner("kind = \"psql\"\n");
        assert_eq!(
            runner_harness_report(&c),
            ["ok    harness from [runner]: none (the psql runner reads no configuration file)"]
        );
    }

    #[test]
    fn a_junit_report_the_command_writes_into_the_tree_is_found() {
        let into_tree = config_with_runner(
            "kind = \"command\"\ncommand = \"pytest --junitxml=out/report.xml\"\njunit = \"./out/report.xml\"\n",
        );
        assert_eq!(
            junit_written_into_tree(&into_tree).as_deref(),
            Some("out/report.xml")
        );
        let right = config_with_runner(
            "kind = \"command\"\ncommand = \"pytest --junitxml=\\\"$CONSORT_JUNIT\\\"\"\njunit = \"report.xml\"\n",
        );
        assert_eq!(junit_written_into_tree(&right), None);
    }

    #[test]
    fn a_placeholder_or_empty_request_is_a_problem_and_a_real_one_is_not() {
        assert!(PLACEHOLDER_REQUEST.contains(PLACEHOLDER_BODY));
        assert!(request_problem(PLACEHOLDER_REQUEST).is_some_and(|p| p.contains("placeholder")));
        assert!(request_problem("").is_some_and(|p| p.contains("Title")));
        assert!(request_problem("# Stock\n\n").is_some_and(|p| p.contains("nothing else")));
        assert!(request_problem("Stock levels\n").is_some_and(|p| p.contains("Title")));
        assert_eq!(request_problem(STOCKFLOW_FEATURE), None);
        assert_eq!(request_problem("# Stock\n\nShow stock per SKU.\n"), None);
    }

    #[test]
    fn token_counts_from_the_environment_are_whole_numbers_or_refused_by_name() {
        assert_eq!(token_count("V", None).ok(), Some(None));
        assert_eq!(token_count("V", Some(" ".into())).ok(), Some(None));
        assert_eq!(
            token_count("V", Some("8_192".into())).ok(),
            Some(Some(8192))
        );
        for bad in ["0", "-5", "8k", "1e9", "99999999999"] {
            let e = token_count("CONSORT_OPENAI_MAX_TOKENS", Some(bad.into()))
                .expect_err(bad)
                .to_string();
            assert!(
                e.contains("CONSORT_OPENAI_MAX_TOKENS") && e.contains(bad),
                "{e}"
            );
        }
    }

    #[test]
    fn doctor_lists_the_harness_a_command_runner_adds() {
        let c = config_with_runner(
            "kind = \"command\"\ncommand = \"sh scripts/run-tests.sh && python -m pytest; sh \\\"$EXTRA\\\"\"\n",
        );
        let lines = runner_harness_report(&c);
        assert_eq!(
            lines[0],
            "ok    harness from [runner] (no agent may change these):"
        );
        assert_eq!(
            lines[1],
            "        scripts/run-tests.sh (run by runner.command)"
        );
        assert!(
            lines[2].starts_with(
                "        Python configuration, at any depth outside the test paths: pyproject.toml,"
            ),
            "{lines:?}"
        );
        assert!(lines[2].contains("conftest.py"), "{lines:?}");
        assert_eq!(
            lines[3],
            "note  runner.command runs $EXTRA, which Consort cannot follow: list that script in [paths] harness"
        );
        assert_eq!(lines.len(), 4, "{lines:?}");
    }
}
