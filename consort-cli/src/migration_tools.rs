//! The project's own migration tool, as `consort init` and `consort doctor` find it: Knex
//! (a `knexfile`), Alembic (`alembic.ini`), Django (`manage.py` with numbered migrations in
//! an app's `migrations/` package) and dbmate (`.sql` files with `-- migrate:up`).
//!
//! Finding one only reads files; `consort init` then writes `[migrations] tool`, and the tool
//! applies the migrations on every branch and at promotion (`consort doctor` runs it once on a
//! fresh branch to show it works).

use std::path::Path;

use consort::config::ToolKind;

/// A migration tool found in a project.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundTool {
    /// The tool.
    pub kind: ToolKind,
    /// What gave it away (`knexfile.js`, `alembic.ini`).
    pub evidence: String,
    /// Its migrations: the folder and how many files it holds, when found.
    pub migrations: Option<(String, usize)>,
    /// The apply command, when the tool's own does not fit (a dbmate that npm installed).
    pub apply: Option<String>,
}

impl FoundTool {
    /// The tool's name for people.
    pub fn title(&self) -> &'static str {
        match self.kind {
            ToolKind::Knex => "Knex",
            ToolKind::Alembic => "Alembic",
            ToolKind::Django => "Django",
            ToolKind::Dbmate => "dbmate",
            ToolKind::Sql | ToolKind::Command => "a migration command",
        }
    }

    /// What `consort init` and `consort doctor` say about it.
    pub fn note(&self) -> String {
        match &self.migrations {
            Some((dir, n)) => format!(
                "found {} migrations ({}, {n} in {dir}/): {} applies them on every branch, confined, and at promotion to the parent; the design's migrations are written there in its format",
                self.title(),
                self.evidence,
                self.title()
            ),
            None => format!(
                "found {} ({}) but no folder of its migrations: set [migrations] tool = \"{}\" and dir to the folder it reads once it has one",
                self.title(),
                self.evidence,
                self.kind.name()
            ),
        }
    }

    /// The `[migrations]` section for it (None without a folder of migrations).
    pub fn section(&self) -> Option<String> {
        let (dir, _) = self.migrations.as_ref()?;
        let apply = self
            .apply
            .as_ref()
            .map(|a| format!("apply = {a:?}\n"))
            .unwrap_or_default();
        let tool = format!("tool = \"{}\"", self.kind.name());
        let dir = format!("dir = {dir:?}");
        Some(format!(
            "[migrations]\n{tool:<30} # {} applies the migrations on every branch, confined, and at promotion\n{dir:<30} # its migrations; the approved design's are written here in its format\n{apply}",
            self.title()
        ))
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

/// The migration tools `dir` uses, by their configuration files, the likeliest first.
pub fn detect(dir: &Path) -> Vec<FoundTool> {
    let mut found = Vec::new();
    let found_tool = |kind, evidence: &str, migrations| FoundTool {
        kind,
        evidence: evidence.into(),
        migrations,
        apply: None,
    };
    let knexfile = ["knexfile.js", "knexfile.ts", "knexfile.cjs", "knexfile.mjs"]
        .into_iter()
        .find(|f| dir.join(f).is_file());
    if let Some(file) = knexfile {
        found.push(found_tool(
            ToolKind::Knex,
            file,
            folder_of(dir, &["js", "ts", "cjs", "mjs"]),
        ));
    }
    if dir.join("alembic.ini").is_file() {
        let versions = script_location(dir).map(|loc| format!("{loc}/versions"));
        found.push(found_tool(
            ToolKind::Alembic,
            "alembic.ini",
            versions.and_then(|v| count_in(dir, &v, &["py"]).map(|n| (v, n))),
        ));
    }
    if dir.join("manage.py").is_file()
        && let Some(apps) = django_migrations(dir)
    {
        found.push(found_tool(ToolKind::Django, "manage.py", Some(apps)));
    }
    if let Some((folder, n)) = dbmate_migrations(dir) {
        let npm = "node_modules/.bin/dbmate";
        found.push(FoundTool {
            apply: dir
                .join(npm)
                .is_file()
                .then(|| format!("{npm} --no-dump-schema --migrations-dir {folder} up")),
            ..found_tool(
                ToolKind::Dbmate,
                "-- migrate:up sections",
                Some((folder, n)),
            )
        });
    }
    found
}

/// The first of [`FOLDERS`] whose `.sql` files are dbmate's (a `-- migrate:up` line), and
/// how many.
fn dbmate_migrations(dir: &Path) -> Option<(String, usize)> {
    FOLDERS.iter().find_map(|folder| {
        let files: Vec<_> = std::fs::read_dir(dir.join(folder))
            .ok()?
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".sql"))
            .collect();
        let dbmate = files.iter().any(|e| {
            std::fs::read_to_string(e.path()).is_ok_and(|t| {
                t.lines()
                    .any(|l| l.trim_start().starts_with("-- migrate:up"))
            })
        });
        dbmate.then(|| (folder.to_string(), files.len()))
    })
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

    use consort_testkit::disk::tree_of as tree;

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
        let tools: Vec<&str> = found.iter().map(FoundTool::title).collect();
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
                && note.contains("Knex applies them on every branch"),
            "{note}"
        );
        let section = found[0].section().expect("a section");
        assert!(
            section.contains("tool = \"knex\"") && section.contains("dir = \"db/migrations\""),
            "{section}"
        );
    }

    #[test]
    fn dbmate_is_found_by_its_sections_and_its_npm_binary() {
        let t = tree(&[
            (
                "db/migrations/20240101000000_init.sql",
                "-- migrate:up\nCREATE TABLE a ();\n-- migrate:down\nDROP TABLE a;\n",
            ),
            ("node_modules/.bin/dbmate", ""),
        ]);
        let found = detect(t.path());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].kind, ToolKind::Dbmate);
        let section = found[0].section().expect("a section");
        assert!(
            section.contains(
                "apply = \"node_modules/.bin/dbmate --no-dump-schema --migrations-dir db/migrations up\""
            ),
            "{section}"
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
