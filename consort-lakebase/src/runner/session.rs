//! The settings every database session of a test run gets, pinned by the runner.
//!
//! Code under test owns its branch's role and database, so it can store settings on them
//! (`ALTER ROLE … SET plpgsql.check_asserts = off`, a `search_path` that puts a schema of its
//! own first). Settings sent by the client at connection time take precedence over those, so
//! every session of a run is started with [`SessionSettings::pgoptions`] in `PGOPTIONS` (psql,
//! libpq-based drivers) or the connection's options (the setup connection): what a test
//! checks and which objects it sees are the runner's decision, not the code's.

use consort_actors::Migration;

/// The settings pinned for every session, besides `search_path`.
pub const PINNED: [(&str, &str); 13] = [
    ("plpgsql.check_asserts", "on"),
    ("transform_null_equals", "off"),
    ("standard_conforming_strings", "on"),
    ("row_security", "on"),
    ("check_function_bodies", "on"),
    ("default_transaction_read_only", "off"),
    ("default_transaction_isolation", "read committed"),
    ("DateStyle", "ISO, MDY"),
    ("IntervalStyle", "postgres"),
    ("TimeZone", "UTC"),
    ("extra_float_digits", "1"),
    ("bytea_output", "hex"),
    ("client_min_messages", "notice"),
];

/// The pinned settings of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSettings {
    /// The schemas searched, in order (`pg_temp` always comes last).
    pub schemas: Vec<String>,
}

impl Default for SessionSettings {
    /// Only `public`.
    fn default() -> Self {
        SessionSettings {
            schemas: vec!["public".into()],
        }
    }
}

impl SessionSettings {
    /// The schemas the schema plan's migrations create (`CREATE SCHEMA [IF NOT EXISTS] name`,
    /// in order), then `public`.
    pub fn for_migrations(migrations: &[Migration]) -> Self {
        let mut schemas = Vec::new();
        for m in migrations {
            for name in created_schemas(&m.sql) {
                if !schemas.contains(&name) {
                    schemas.push(name);
                }
            }
        }
        if !schemas.iter().any(|s| s == "public") {
            schemas.push("public".into());
        }
        SessionSettings { schemas }
    }

    /// `search_path`: the schemas, then `pg_temp` (so a temporary table cannot shadow a
    /// table of the plan, which it would if `pg_temp` were searched first, its default).
    pub fn search_path(&self) -> String {
        let mut parts = self.schemas.clone();
        parts.push("pg_temp".into());
        parts.join(",")
    }

    /// Every pinned setting as `(name, value)`.
    pub fn all(&self) -> Vec<(String, String)> {
        let mut out = vec![("search_path".to_string(), self.search_path())];
        out.extend(PINNED.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        out
    }

    /// The settings as libpq's `PGOPTIONS` / the startup `options` (`-c name=value …`, spaces
    /// in values escaped).
    pub fn pgoptions(&self) -> String {
        self.all()
            .iter()
            .map(|(k, v)| format!("-c {k}={}", v.replace('\\', "\\\\").replace(' ', "\\ ")))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// The plain (unquoted, lower-case) names `CREATE SCHEMA` statements in `sql` create.
fn created_schemas(sql: &str) -> Vec<String> {
    let words: Vec<String> = sql
        .split(|c: char| c.is_whitespace() || c == ';' || c == '(')
        .filter(|w| !w.is_empty())
        .map(|w| w.to_ascii_lowercase())
        .collect();
    let mut out = Vec::new();
    for (i, w) in words.iter().enumerate() {
        if w != "create" || words.get(i + 1).map(String::as_str) != Some("schema") {
            continue;
        }
        let mut j = i + 2;
        if words.get(j).map(String::as_str) == Some("if") {
            j += 3; // if not exists
        }
        if let Some(name) = words.get(j)
            && is_plain_identifier(name)
            && name != "authorization"
        {
            out.push(name.clone());
        }
    }
    out
}

fn is_plain_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '$')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn migration(sql: &str) -> Migration {
        Migration {
            version: "0001".into(),
            story_id: "S1".into(),
            description: String::new(),
            sql: sql.into(),
        }
    }

    #[test]
    fn the_plan_s_schemas_come_first_and_pg_temp_last() {
        let s = SessionSettings::for_migrations(&[
            migration("CREATE SCHEMA inventory;\nCREATE TABLE inventory.stock (id int);"),
            migration("create schema if not exists audit; CREATE SCHEMA \"Odd\";"),
        ]);
        assert_eq!(s.search_path(), "inventory,audit,public,pg_temp");
        assert_eq!(
            SessionSettings::for_migrations(&[]).search_path(),
            "public,pg_temp"
        );
    }

    #[test]
    fn pgoptions_escape_spaces() {
        let o = SessionSettings::default().pgoptions();
        assert!(o.starts_with("-c search_path=public,pg_temp -c plpgsql.check_asserts=on"));
        assert!(o.contains("-c DateStyle=ISO,\\ MDY"), "{o}");
        assert!(o.contains("-c default_transaction_isolation=read\\ committed"));
    }
}
