//! The project's own migration tool, as `consort init` and `consort doctor` find it.
//!
//! Consort applies migration files of SQL (psql scripts among them, and dbmate's files, up
//! section only). A project whose schema lives in a framework's tool — Knex, Alembic,
//! Django — gets a note saying so, with what Consort will and will not do about it, instead of
//! a configuration that silently applies nothing.

use std::path::Path;

/// A migration tool found in a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundTool {
    /// The tool (`Knex`, `Alembic`, `Django`).
    pub tool: &'static str,
    /// What gave it away (`knexfile.js`, `alembic.ini`).
    pub evidence: String,
    /// Its migrations: the folder and how many files it holds, when found.
    pub migrations: Option<(String, usize)>,
}

impl FoundTool {
    /// What `consort init` and `consort doctor` say about it.
    pub fn note(&self) -> String {
        let held = match &self.migrations {
            Some((dir, n)) => format!(", {n} in {dir}/"),
            None => String::new(),
        };
        format!(
            "found {} migrations ({}{held}): Consort applies SQL migration files only and does not run {}, so a branch holds only what the .sql files of [migrations] dir make, and the design's migrations are written as .sql files there; until the tool is configured, have the test command apply the project's own migrations before the tests",
            self.tool, self.evidence, self.tool
        )
    }
}

/// Where frameworks keep their migrations, relative to the project.
const FOLDERS: [&str; 5] = [
    "migrations",
    "db/migrations",
    "src/db/migrations",
    "database/migrations",
    "src/migrations",
];

/// The migration tools `dir` uses, by their configuration files.
pub fn detect(dir: &Path) -> Vec<FoundTool> {
    let mut found = Vec::new();
    let knexfile = ["knexfile.js", "knexfile.ts", "knexfile.cjs", "knexfile.mjs"]
        .into_iter()
        .find(|f| dir.join(f).is_file());
    if let Some(file) = knexfile {
        found.push(FoundTool {
            tool: "Knex",
            evidence: file.into(),
            migrations: folder_of(dir, &["js", "ts", "cjs", "mjs"]),
        });
    }
    if dir.join("alembic.ini").is_file() {
        let versions = script_location(dir).map(|loc| format!("{loc}/versions"));
        found.push(FoundTool {
            tool: "Alembic",
            evidence: "alembic.ini".into(),
            migrations: versions.and_then(|v| count_in(dir, &v, &["py"]).map(|n| (v, n))),
        });
    }
    if dir.join("manage.py").is_file()
        && let Some(apps) = django_migrations(dir)
    {
        found.push(FoundTool {
            tool: "Django",
            evidence: "manage.py".into(),
            migrations: Some(apps),
        });
    }
    found
}

/// The first of [`FOLDERS`] holding files with one of `extensions`, and how many.
fn folder_of(dir: &Path, extensions: &[&str]) -> Option<(String, usize)> {
    FOLDERS
        .iter()
        .find_map(|f| count_in(dir, f, extensions).map(|n| (f.to_string(), n)))
}

/// How many files with one of `extensions` `folder` holds (none: `None`).
fn count_in(dir: &Path, folder: &str, extensions: &[&str]) -> Option<usize> {
    let n = std::fs::read_dir(dir.join(folder))
        .ok()?
        .flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            !name.starts_with("__") && extensions.iter().any(|x| name.ends_with(&format!(".{x}")))
        })
        .count();
    (n > 0).then_some(n)
}

/// `script_location` in `alembic.ini` (`alembic` by default), as a folder of the project.
fn script_location(dir: &Path) -> Option<String> {
    let ini = std::fs::read_to_string(dir.join("alembic.ini")).ok()?;
    let value = ini
        .lines()
        .filter_map(|l| l.split_once('='))
        .find(|(k, _)| k.trim() == "script_location")
        .map(|(_, v)| v.trim().trim_start_matches("%(here)s/").to_string())
        .unwrap_or_else(|| "alembic".into());
    (!value.is_empty() && !value.contains("..")).then_some(value)
}

/// Django apps' migration folders (`<app>/migrations/0001_*.py`, two levels deep at most): the
/// first such folder and the count of numbered migrations in all of them.
fn django_migrations(dir: &Path) -> Option<(String, usize)> {
    let mut first = None;
    let mut total = 0;
    let mut apps = vec![dir.to_path_buf()];
    for _ in 0..2 {
        let mut next = Vec::new();
        for app in apps {
            for entry in std::fs::read_dir(&app).into_iter().flatten().flatten() {
                let path = entry.path();
                if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                    continue;
                }
                let name = entry.file_name();
                if name.to_string_lossy().starts_with('.') || name == "node_modules" {
                    continue;
                }
                let numbered = std::fs::read_dir(path.join("migrations"))
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter(|m| {
                        let n = m.file_name();
                        let n = n.to_string_lossy();
                        n.ends_with(".py") && n.starts_with(|c: char| c.is_ascii_digit())
                    })
                    .count();
                if numbered > 0 {
                    total += numbered;
                    let rel = path.join("migrations");
                    let rel = rel.strip_prefix(dir).unwrap_or(&rel).display().to_string();
                    first.get_or_insert(rel);
                }
                next.push(path);
            }
        }
        apps = next;
    }
    first.map(|f| (f, total))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for (path, text) in files {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        dir
    }

    #[test]
    fn knex_alembic_and_django_are_found_with_their_migrations() {
        let t = tree(&[
            ("knexfile.js", "module.exports = {};"),
            ("db/migrations/20240101_users.js", ""),
            ("db/migrations/20240102_orders.js", ""),
            (
                "alembic.ini",
                "[alembic]\nscript_location = migrations_py\n",
            ),
            ("migrations_py/versions/abc123_init.py", ""),
            ("manage.py", ""),
            ("shop/orders/migrations/0001_initial.py", ""),
            ("shop/orders/migrations/0002_more.py", ""),
            ("shop/orders/migrations/__init__.py", ""),
        ]);
        let found = detect(t.path());
        let tools: Vec<&str> = found.iter().map(|f| f.tool).collect();
        assert_eq!(tools, ["Knex", "Alembic", "Django"]);
        assert_eq!(found[0].migrations, Some(("db/migrations".into(), 2)));
        assert_eq!(
            found[1].migrations,
            Some(("migrations_py/versions".into(), 1))
        );
        assert_eq!(
            found[2].migrations,
            Some(("shop/orders/migrations".into(), 2))
        );
        let note = found[0].note();
        assert!(
            note.starts_with("found Knex migrations (knexfile.js, 2 in db/migrations/)")
                && note.contains("does not run Knex"),
            "{note}"
        );
    }

    #[test]
    fn plain_sql_and_a_bare_package_json_are_no_tool() {
        let t = tree(&[
            ("migrations/0001_init.sql", "CREATE TABLE a ();"),
            ("package.json", "{\"dependencies\":{\"pg\":\"8\"}}"),
            ("manage.py", ""),
        ]);
        assert!(detect(t.path()).is_empty());
    }
}
