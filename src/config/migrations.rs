//! `[migrations]`: where the design's migrations are written, and which tool applies them —
//! Consort itself for plain SQL files (psql scripts among them), or the project's own
//! migration tool (Knex, Alembic, Django, dbmate, or a command of its own).
//!
//! A tool is a few facts: the extension of its files, the command that applies every pending
//! migration, the SQL that lists what its bookkeeping recorded, and how a record names a file.
//! Each named tool has them built in; `command` takes them from the configuration.

use std::time::Duration;

use consort_actors::{Recorded, ToolFormat};
use serde::{Deserialize, Serialize};

use super::runner::default_true;

/// How long the tool's apply command may run.
const APPLY_LIMIT: Duration = Duration::from_secs(600);

/// `[migrations]`: the design's migrations as files, and the tool that applies them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigrationsConfig {
    /// The directory the approved design's migrations are written to, as
    /// `NNNN_<story>_<name>.<extension>` (default `migrations`). Harness: no agent writes here.
    #[serde(default = "default_migrations_dir")]
    pub dir: String,
    /// Which tool applies the migrations (default `sql`: Consort applies the `.sql` files
    /// itself; see [`ToolKind`]).
    #[serde(default)]
    pub tool: ToolKind,
    /// The command that applies every pending migration in `dir`, run with `sh -c` from the
    /// work tree, confined, with the database in its environment (a named tool has its own;
    /// `command` needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apply: Option<String>,
    /// SQL whose rows' first column names the migrations the tool recorded as applied (a
    /// named tool has its own; `command` needs one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied: Option<String>,
    /// For `command`: the extension of a migration file (default `sql`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extension: Option<String>,
    /// For `command`: how a record of `applied` names a file (default `stem`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded: Option<Recorded>,
    /// With `sql`: apply the `.sql` files already in `dir` (the project's existing
    /// migrations, in version order; `.down.sql` left out) before the design's, on every
    /// branch and at promotion (default true). A tool applies what its folder holds.
    #[serde(default = "default_true")]
    pub apply_existing: bool,
    /// With `sql`: apply them to the parent at promotion too (default true; a version the
    /// parent's migration record already holds is skipped). Set false when the parent
    /// database got them some other way.
    #[serde(default = "default_true")]
    pub promote_existing: bool,
}

impl Default for MigrationsConfig {
    fn default() -> Self {
        MigrationsConfig {
            dir: default_migrations_dir(),
            tool: ToolKind::Sql,
            apply: None,
            applied: None,
            extension: None,
            recorded: None,
            apply_existing: true,
            promote_existing: true,
        }
    }
}

fn default_migrations_dir() -> String {
    "migrations".into()
}

/// The tool that applies a project's migrations.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ToolKind {
    /// Consort applies the `.sql` files itself, each in a transaction, recorded in
    /// `consort_migrations`; a project's psql scripts by psql.
    #[default]
    Sql,
    /// Knex (`knex migrate:latest`, `knex_migrations`).
    Knex,
    /// Alembic (`alembic upgrade head`, `alembic_version`).
    Alembic,
    /// Django (`manage.py migrate`, `django_migrations`).
    Django,
    /// dbmate (`dbmate up`, `schema_migrations`).
    Dbmate,
    /// A command of the project's own, with `apply` and `applied`.
    Command,
}

impl ToolKind {
    /// The name `[migrations] tool` takes.
    pub fn name(self) -> &'static str {
        match self {
            ToolKind::Sql => "sql",
            ToolKind::Knex => "knex",
            ToolKind::Alembic => "alembic",
            ToolKind::Django => "django",
            ToolKind::Dbmate => "dbmate",
            ToolKind::Command => "command",
        }
    }

    /// The tool's own facts: extension, apply command (for `dir`), bookkeeping query, and how
    /// it records a file. None for `sql` and `command`.
    fn preset(self, dir: &str) -> Option<(&'static str, String, &'static str, Recorded)> {
        Some(match self {
            ToolKind::Sql | ToolKind::Command => return None,
            ToolKind::Knex => (
                "js",
                // Node resolves a symlink to its target, and a knexfile that finds its folder
                // from `__dirname` would read the tree, not the run's view of it.
                "NODE_PRESERVE_SYMLINKS=1 node_modules/.bin/knex migrate:latest".into(),
                "SELECT name FROM knex_migrations",
                Recorded::FileName,
            ),
            ToolKind::Alembic => (
                "py",
                "PYTHONDONTWRITEBYTECODE=1 alembic upgrade head".into(),
                "SELECT version_num FROM alembic_version",
                Recorded::Revision,
            ),
            ToolKind::Django => (
                "py",
                // Python puts the real directory of a symlinked script first on its path;
                // the view's own directory must come first instead.
                "PYTHONDONTWRITEBYTECODE=1 PYTHONSAFEPATH=1 PYTHONPATH=\"$PWD\" python manage.py migrate --noinput".into(),
                "SELECT name FROM django_migrations",
                Recorded::Stem,
            ),
            ToolKind::Dbmate => (
                "sql",
                format!(
                    "dbmate --no-dump-schema --migrations-dir {} up",
                    consort_lakebase::shell_quote(dir)
                ),
                "SELECT version FROM schema_migrations",
                Recorded::Number,
            ),
        })
    }
}

impl MigrationsConfig {
    /// The tool's format for the state machine (None: plain SQL that Consort applies). A
    /// configuration holds no settings [`MigrationsConfig::check`] refuses once it is read.
    pub fn tool_format(&self) -> Option<ToolFormat> {
        self.resolved().ok().flatten().map(|(format, _, _)| format)
    }

    /// The project's migration tool for the verifier, running with the test command's
    /// environment `env` (None: plain SQL that Consort applies).
    pub fn migration_tool(
        &self,
        env: consort_lakebase::EnvPolicy,
    ) -> Result<Option<consort_lakebase::migrate::MigrationTool>, String> {
        Ok(self.resolved()?.map(|(format, apply, applied)| {
            consort_lakebase::migrate::MigrationTool {
                name: format.name,
                apply,
                applied,
                env,
                timeout: APPLY_LIMIT,
            }
        }))
    }

    /// Checks the tool's settings: `command` names its commands, a named tool takes none of
    /// `command`'s, the extension is a plain one.
    pub fn check(&self) -> Result<(), (String, String)> {
        self.resolved()
            .map(|_| ())
            .map_err(|m| ("migrations.tool".to_string(), m))
    }

    /// The format, the apply command and the bookkeeping query, from the tool's preset and
    /// what the configuration overrides.
    fn resolved(&self) -> Result<Option<(ToolFormat, String, String)>, String> {
        let tool = self.tool;
        if tool == ToolKind::Sql {
            return match (&self.apply, &self.applied, &self.extension, &self.recorded) {
                (None, None, None, None) => Ok(None),
                _ => Err("apply, applied, extension and recorded are for a migration tool; with tool = \"sql\" Consort applies the .sql files itself".into()),
            };
        }
        let preset = tool.preset(&self.dir);
        if preset.is_some() && (self.extension.is_some() || self.recorded.is_some()) {
            return Err(format!(
                "extension and recorded are {}'s own; they are set for tool = \"command\" only",
                tool.name()
            ));
        }
        let (extension, apply, applied, recorded) = match preset {
            Some((ext, apply, applied, recorded)) => (
                ext.to_string(),
                self.apply.clone().unwrap_or(apply),
                self.applied.clone().unwrap_or_else(|| applied.into()),
                recorded,
            ),
            None => {
                let (Some(apply), Some(applied)) = (&self.apply, &self.applied) else {
                    return Err("tool = \"command\" needs `apply` (the command that applies every pending migration in dir) and `applied` (SQL listing the applied ones)".into());
                };
                (
                    self.extension.clone().unwrap_or_else(|| "sql".into()),
                    apply.clone(),
                    applied.clone(),
                    self.recorded.unwrap_or_default(),
                )
            }
        };
        if extension.is_empty() || !extension.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!(
                "extension `{extension}` is not a plain file extension such as `sql` or `js`"
            ));
        }
        if apply.trim().is_empty() || applied.trim().is_empty() {
            return Err("apply and applied may not be empty".into());
        }
        Ok(Some((
            ToolFormat {
                name: tool.name().into(),
                extension,
                recorded,
            },
            apply,
            applied,
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> MigrationsConfig {
        toml::from_str(text).expect("a [migrations] table")
    }

    #[test]
    fn a_named_tool_brings_its_own_commands_and_format() {
        let knex = read("dir = \"db/migrations\"\ntool = \"knex\"\n");
        let format = knex.tool_format().expect("a tool");
        assert_eq!(
            (format.extension.as_str(), format.recorded),
            ("js", Recorded::FileName)
        );
        let tool = knex
            .migration_tool(consort_lakebase::EnvPolicy::default())
            .expect("valid")
            .expect("a tool");
        assert_eq!(
            tool.apply,
            "NODE_PRESERVE_SYMLINKS=1 node_modules/.bin/knex migrate:latest"
        );
        assert_eq!(tool.applied, "SELECT name FROM knex_migrations");
        let dbmate = read("dir = \"db/my migrations\"\ntool = \"dbmate\"\n")
            .migration_tool(consort_lakebase::EnvPolicy::default())
            .expect("valid")
            .expect("a tool");
        assert_eq!(
            dbmate.apply,
            "dbmate --no-dump-schema --migrations-dir 'db/my migrations' up"
        );
        assert_eq!(read("").tool_format(), None);
    }

    #[test]
    fn a_command_tool_needs_its_commands_and_sql_takes_none() {
        let told = read("tool = \"command\"\napply = \"make migrate\"\n")
            .check()
            .expect_err("no applied");
        assert!(told.1.contains("needs `apply`"), "{told:?}");
        let ok = read(
            "tool = \"command\"\napply = \"make migrate\"\napplied = \"SELECT id FROM done\"\nextension = \"rb\"\nrecorded = \"number\"\n",
        );
        let format = ok.tool_format().expect("a tool");
        assert_eq!(
            (format.extension.as_str(), format.recorded),
            ("rb", Recorded::Number)
        );
        assert!(read("apply = \"x\"\n").check().is_err());
        assert!(
            read("tool = \"knex\"\nextension = \"ts\"\n")
                .check()
                .is_err()
        );
        assert!(
            read("tool = \"command\"\napply = \"x\"\napplied = \"y\"\nextension = \"../x\"\n")
                .check()
                .is_err()
        );
    }
}
