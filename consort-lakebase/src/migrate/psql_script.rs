//! A project's existing schema script written for psql (`\set`, `:"var"`, `\i`, COPY data),
//! applied by psql itself: the one kind of migration that is not sent through the protocol.
//!
//! Only a project's own files reach here: the design's migrations are SQL, and the state
//! machine refuses one that is a psql script (`check_schema`), since psql runs what its
//! meta-commands say (`\!` a shell command) as Consort's user, outside any confinement.

use std::process::Stdio;
use std::time::Duration;

use consort_actors::Migration;
use tokio::io::AsyncWriteExt;

use crate::error::{Error, Result};
use crate::provider::ConnectInfo;

/// How long one script may run.
const SCRIPT_LIMIT: Duration = Duration::from_secs(600);

/// Where psql applies a script: the database, and the role it is applied as.
#[derive(Clone)]
pub struct PsqlTarget {
    /// The database's connection (its secret goes to psql's environment only).
    pub conn: ConnectInfo,
    /// `SET ROLE` to this role first (the owner role of a server backend).
    pub role: Option<String>,
}

impl std::fmt::Debug for PsqlTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PsqlTarget")
            .field("database", &self.conn.database)
            .field("role", &self.role)
            .finish_non_exhaustive()
    }
}

/// Applies `m` with psql at `target` in one transaction (`--single-transaction`, stopping at
/// the first error): nothing of a failing script stays. A failure is the migration's
/// [`Error::Migration`] with what psql said last.
pub(crate) async fn apply(target: &PsqlTarget, m: &Migration) -> Result<()> {
    let psql = crate::pgbin::find_psql()?;
    let mut cmd = tokio::process::Command::new(psql);
    cmd.args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "--single-transaction"]);
    if let Some(role) = &target.role {
        cmd.arg("-c")
            .arg(format!("SET ROLE {}", crate::names::quote_ident(role)));
    }
    cmd.args(["-f", "-"])
        .env_clear()
        .envs(std::env::var_os("PATH").map(|p| ("PATH", p)))
        .env("LC_ALL", "C")
        .envs(target.conn.env())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let failed = |detail: String| Error::Migration {
        version: m.version.clone(),
        detail,
    };
    let mut child = cmd
        .spawn()
        .map_err(|e| failed(format!("psql could not be started: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(m.sql.as_bytes())
            .await
            .map_err(|e| failed(format!("writing the script to psql: {e}")))?;
    }
    let out = tokio::time::timeout(SCRIPT_LIMIT, child.wait_with_output())
        .await
        .map_err(|_| {
            failed(format!(
                "psql ran {} and was stopped",
                consort_actors::duration_text(SCRIPT_LIMIT)
            ))
        })?
        .map_err(|e| failed(format!("waiting for psql: {e}")))?;
    if out.status.success() {
        return Ok(());
    }
    let said = String::from_utf8_lossy(&out.stderr);
    let said = crate::runner::redact(said.trim(), &target.conn);
    Err(failed(format!(
        "psql stopped the script ({}): {}",
        out.status,
        last_lines(&said, 6)
    )))
}

/// The last `n` non-empty lines of `text`, joined by ` / `.
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    lines[lines.len().saturating_sub(n)..].join(" / ")
}
