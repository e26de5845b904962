//! The names a project reads its database connection under (`DB_HOST`, `POSTGRES_SERVER`,
//! `DB_PASSWORD`), as `consort init` finds them in its database configuration — a
//! `knexfile`, Django's `settings.py`, Alembic's `env.py`, a `db.js` — so that `[branch_env]`
//! maps every run's branch onto them and no command needs a wrapper that renames variables.
//!
//! Finding them only reads files. A name counts when it reads like a database setting (a
//! `DB`, `DATABASE`, `POSTGRES`, `POSTGRESQL` or `SQL` part) and its last part says which
//! field it is; libpq's own names (`PG…`) and `DATABASE_URL` are every run's already.

use std::collections::BTreeMap;
use std::path::Path;

/// The files a project's database configuration lives in, by name.
const CONFIG_FILES: [&str; 14] = [
    "knexfile.js",
    "knexfile.ts",
    "knexfile.cjs",
    "knexfile.mjs",
    "settings.py",
    "env.py",
    "db.js",
    "db.ts",
    "database.js",
    "database.ts",
    "db.py",
    "database.py",
    "config.py",
    "config.js",
];

/// How deep below the project the files are looked for.
const DEPTH: usize = 3;

/// The project's own names for the branch's fields, and the files they were read in.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FoundEnv {
    /// Name → template (`DB_HOST` → `{host}`).
    pub mapping: BTreeMap<String, &'static str>,
    /// The files the names were found in, relative to the project.
    pub files: Vec<String>,
}

impl FoundEnv {
    /// The `[branch_env]` section (None when nothing was found).
    pub fn section(&self) -> Option<String> {
        if self.mapping.is_empty() {
            return None;
        }
        let mut out = format!(
            "[branch_env]                    # the branch under the names {} reads\n",
            self.files.join(", ")
        );
        for (name, template) in &self.mapping {
            out.push_str(&format!("{name} = \"{template}\"\n"));
        }
        Some(out)
    }

    /// What `consort init` says about it.
    pub fn note(&self) -> String {
        format!(
            "found the database under the project's own names in {}: {}; [branch_env] maps every run's branch onto them, for the tests, the migration tool and `consort exec`",
            self.files.join(", "),
            self.mapping.keys().cloned().collect::<Vec<_>>().join(", ")
        )
    }
}

/// The names the database configuration files of `dir` read.
pub fn detect(dir: &Path) -> FoundEnv {
    let mut found = FoundEnv::default();
    for file in config_files(dir) {
        let Ok(text) = std::fs::read_to_string(dir.join(&file)) else {
            continue;
        };
        let mut any = false;
        for name in variables_read(&text) {
            if let Some(template) = field_of(&name) {
                found.mapping.insert(name, template);
                any = true;
            }
        }
        if any {
            found.files.push(file);
        }
    }
    found
}

/// The configuration files under `dir`, [`DEPTH`] levels down, dependencies and caches
/// skipped, in path order.
fn config_files(dir: &Path) -> Vec<String> {
    let filter = consort_actors::TreeFilter::default();
    let mut out = Vec::new();
    let mut todo = vec![(dir.to_path_buf(), 0usize)];
    while let Some((d, level)) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Ok(kind) = entry.file_type() else {
                continue;
            };
            if kind.is_dir() && level + 1 < DEPTH && !filter.skips(&name) && !name.starts_with('.')
            {
                todo.push((entry.path(), level + 1));
            } else if kind.is_file() && CONFIG_FILES.contains(&name.as_str()) {
                let path = entry.path();
                let rel = path.strip_prefix(dir).unwrap_or(&path);
                out.push(rel.display().to_string());
            }
        }
    }
    out.sort();
    out
}

/// The environment variables `text` reads: `process.env.NAME`, `process.env['NAME']`,
/// `os.environ['NAME']`, `os.environ.get('NAME')`, `os.getenv('NAME')`.
fn variables_read(text: &str) -> Vec<String> {
    let mut names = Vec::new();
    for (at, _) in text.match_indices("process.env.") {
        let rest = &text[at + "process.env.".len()..];
        let name: String = rest
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        names.push(name);
    }
    for marker in ["process.env[", "environ[", "environ.get(", "getenv("] {
        for (at, _) in text.match_indices(marker) {
            let rest = text[at + marker.len()..].trim_start();
            let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                continue;
            };
            if let Some(end) = rest[1..].find(quote) {
                names.push(rest[1..=end].to_string());
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names.sort();
    names.dedup();
    names
}

/// The template a name takes, when it reads like a database setting that is not already
/// every run's own.
fn field_of(name: &str) -> Option<&'static str> {
    if name.starts_with("PG") || name == "DATABASE_URL" {
        return None;
    }
    let parts: Vec<&str> = name.split('_').collect();
    let database_like = parts
        .iter()
        .any(|p| matches!(*p, "DB" | "DATABASE" | "POSTGRES" | "POSTGRESQL" | "SQL"));
    if !database_like {
        return None;
    }
    Some(match *parts.last()? {
        "HOST" | "HOSTNAME" | "SERVER" => "{host}",
        "PORT" => "{port}",
        "NAME" | "DB" | "DATABASE" | "DBNAME" => "{database}",
        "USER" | "USERNAME" => "{user}",
        "PASSWORD" | "PASS" | "PASSWD" | "PWD" => "{password}",
        "URL" | "URI" | "DSN" => "{url}",
        "SSLMODE" => "{sslmode}",
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_knexfile_and_django_settings_give_their_names_and_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let write = |path: &str, text: &str| {
            let p = dir.path().join(path);
            std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        };
        write(
            "knexfile.js",
            "module.exports = { connection: { host: process.env.DB_HOST, port: process.env['DB_PORT'], database: process.env.DB_NAME, password: process.env.DB_PASSWORD }, pool: { max: process.env.POOL_MAX }, port: process.env.PORT };",
        );
        write(
            "mysite/settings.py",
            "import os\nNAME = os.environ.get('POSTGRES_DB')\nHOST = os.getenv(\"POSTGRES_SERVER\")\nUSER = os.environ['POSTGRES_USER']\nSECRET = os.environ['SECRET_KEY']\nX = os.environ['PGHOST']\n",
        );
        write("node_modules/pg/db.js", "process.env.DB_SECRET_HOST");
        let found = detect(dir.path());
        let mapping: Vec<(&str, &str)> = found
            .mapping
            .iter()
            .map(|(k, v)| (k.as_str(), *v))
            .collect();
        assert_eq!(
            mapping,
            [
                ("DB_HOST", "{host}"),
                ("DB_NAME", "{database}"),
                ("DB_PASSWORD", "{password}"),
                ("DB_PORT", "{port}"),
                ("POSTGRES_DB", "{database}"),
                ("POSTGRES_SERVER", "{host}"),
                ("POSTGRES_USER", "{user}"),
            ]
        );
        assert_eq!(found.files, ["knexfile.js", "mysite/settings.py"]);
        let section = found.section().expect("a section");
        assert!(section.contains("DB_HOST = \"{host}\"\n"), "{section}");
    }

    #[test]
    fn a_project_without_names_of_its_own_gets_no_section() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("knexfile.js"),
            "module.exports = { connection: process.env.DATABASE_URL };",
        )
        .expect("write");
        assert_eq!(detect(dir.path()).section(), None);
    }
}
