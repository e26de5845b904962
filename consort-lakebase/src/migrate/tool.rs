//! A project's own migration tool (Knex, Alembic, Django, dbmate, or a command of its own)
//! applying the migrations in its folder to a branch, or at promotion to the parent.
//!
//! The tool runs what the project wrote (`knexfile.js`, `env.py`, `settings.py`), so it runs
//! as the tests do: confined ([`RunContext::jail`]), in a view of the work tree that leaves
//! out Consort's state and the design's migrations the run does not apply, with the database
//! in its environment under libpq's names and the project's own (`[branch_env]`). What it did
//! is read back from its own bookkeeping table, never from what it printed.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use crate::error::{Error, Result};
use crate::provider::ConnectInfo;
use crate::runner::{Capture, EnvPolicy, OutputLimits, RunContext};

/// How much of the tool's output a failure quotes (its end, where the error is).
const QUOTED: usize = 2_000;

/// A project's migration tool, as `[migrations]` configures it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationTool {
    /// Its name, for messages (`knex`).
    pub name: String,
    /// The command that applies every pending migration, run with `sh -c` from the work tree
    /// (`npx knex migrate:latest`).
    pub apply: String,
    /// SQL whose rows' first column lists the migrations the tool recorded as applied
    /// (`SELECT name FROM knex_migrations`); a table that does not exist yet lists none.
    pub applied: String,
    /// The environment the command gets (the test command's).
    pub env: EnvPolicy,
    /// How long one apply may take; the process group is killed at the limit.
    pub timeout: Duration,
}

/// What one apply did.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ToolApplied {
    /// Of the records asked for, those the tool recorded now.
    pub applied: Vec<String>,
    /// Of the records asked for, those it held already.
    pub already_applied: Vec<String>,
    /// Every record the bookkeeping holds afterwards.
    pub recorded: BTreeSet<String>,
    /// How long the command ran.
    pub ms: u64,
}

impl MigrationTool {
    /// Runs the apply command in `ctx` (its branch, confinement and view), then checks that
    /// the tool's bookkeeping holds every one of `expect`. A command that fails, times out or
    /// leaves one of `expect` unrecorded is [`Error::MigrationTool`] with what the tool said (its
    /// output's end, the connection's secret removed).
    pub async fn apply(&self, ctx: &RunContext, expect: &[String]) -> Result<ToolApplied> {
        let before = self.recorded(&ctx.conn).await?;
        let started = Instant::now();
        let spec = crate::runner::process::ProcSpec {
            program: PathBuf::from("sh"),
            args: vec!["-c".into(), self.apply.clone()],
            cwd: ctx.process_view()?,
            env: self.env.build_for(ctx),
            timeout: self.timeout,
            jail: ctx.jail.clone(),
        };
        let limits = OutputLimits::default();
        let mut capture = Capture::new(&limits);
        let outcome = crate::runner::process::run(&spec, &mut capture, &limits).await?;
        let ms = started.elapsed().as_millis() as u64;
        let said = || quoted(&capture.clone().finish().excerpt, &ctx.conn);
        if !outcome.exit.success() {
            let ended = if outcome.exit.timed_out {
                format!(
                    "did not finish within {}",
                    crate::error::duration_text(self.timeout)
                )
            } else {
                format!("ended with {}", outcome.exit)
            };
            return Err(self.failed(format!("`{}` {ended}: {}", self.apply, said())));
        }
        let recorded = self.recorded(&ctx.conn).await?;
        let missing: Vec<&str> = expect
            .iter()
            .filter(|r| !recorded.contains(*r))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            return Err(self.failed(format!(
                "`{}` succeeded but its bookkeeping (`{}`) does not hold {}: does the tool read its migrations from the folder `[migrations] dir` names? It said: {}",
                self.apply,
                self.applied,
                missing.join(", "),
                said()
            )));
        }
        let (already_applied, applied) = expect.iter().cloned().partition(|r| before.contains(r));
        Ok(ToolApplied {
            applied,
            already_applied,
            recorded,
            ms,
        })
    }

    /// The records of the tool's bookkeeping in the database `conn` reaches (none while its
    /// table does not exist).
    pub async fn recorded(&self, conn: &ConnectInfo) -> Result<BTreeSet<String>> {
        let client = crate::pgconn::connect(conn).await?;
        match client.simple_query(&self.applied).await {
            Ok(messages) => Ok(messages
                .into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(row) => row.get(0).map(str::to_string),
                    _ => None,
                })
                .collect()),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => Ok(BTreeSet::new()),
            Err(e) => Err(self.failed(format!(
                "its bookkeeping could not be read with `{}`: {}",
                self.applied,
                match e.as_db_error() {
                    Some(db) => crate::error::db_text(db),
                    None => consort_actors::error_chain(&e),
                }
            ))),
        }
    }

    fn failed(&self, detail: String) -> Error {
        Error::MigrationTool {
            tool: self.name.clone(),
            detail,
        }
    }
}

/// The end of the tool's output (at most [`QUOTED`] bytes), the connection's secret removed.
fn quoted(excerpt: &str, conn: &ConnectInfo) -> String {
    let text = crate::runner::redact(excerpt, conn);
    let text = text.trim();
    let start = text.len().saturating_sub(QUOTED);
    let start = (start..=text.len())
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(text.len());
    match &text[start..] {
        "" => "(nothing)".into(),
        tail => tail.to_string(),
    }
}
