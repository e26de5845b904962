//! The branch under the names a project reads.
//!
//! Every test process gets its branch as `PGHOST`, `PGPORT`, … and `DATABASE_URL`
//! ([`crate::BRANCH_ENV`]). Real projects read their connection from names of their own
//! (`DB_HOST`, `POSTGRES_SERVER`, a URL in their driver's form); `[branch_env]` maps the branch
//! onto them with templates over its connection, so that no command needs an `sh -c` wrapper
//! to rename variables:
//!
//! ```toml
//! [branch_env]
//! DB_HOST = "{host}"
//! DB_NAME = "{database}"
//! SQLALCHEMY_URL = "postgresql+psycopg://{user}:{password}@{host}:{port}/{database}"
//! ```
//!
//! The fields are `{host}`, `{port}`, `{database}`, `{user}`, `{password}`, `{url}` (the
//! branch's `DATABASE_URL`) and `{sslmode}`; `{{` and `}}` are literal braces. A template
//! names nothing else: an unknown field is refused when the configuration is read. What a
//! template renders holds the branch's password at most, which every output Consort keeps is
//! already scrubbed of.

use crate::provider::ConnectInfo;

/// One field of the branch's connection a template may name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Host,
    Port,
    Database,
    User,
    Password,
    Url,
    Sslmode,
}

impl Field {
    const ALL: [(&'static str, Field); 7] = [
        ("host", Field::Host),
        ("port", Field::Port),
        ("database", Field::Database),
        ("user", Field::User),
        ("password", Field::Password),
        ("url", Field::Url),
        ("sslmode", Field::Sslmode),
    ];

    fn of(conn: &ConnectInfo, field: Field) -> String {
        match field {
            Field::Host => conn.host.clone(),
            Field::Port => conn.port.to_string(),
            Field::Database => conn.database.clone(),
            Field::User => conn.user.clone(),
            Field::Password => conn.secret.expose().to_string(),
            Field::Url => conn.database_url().expose().to_string(),
            Field::Sslmode => conn.libpq_sslmode().to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Field(Field),
}

/// `[branch_env]` read: each variable's template over the branch's connection.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BranchEnv {
    vars: Vec<(String, Vec<Part>)>,
}

impl BranchEnv {
    /// Reads `vars` (name, template). Fails on a template that names an unknown field or
    /// leaves a brace open, saying which variable and what.
    pub fn parse<'a>(
        vars: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Result<BranchEnv, String> {
        let vars = vars
            .into_iter()
            .map(|(name, template)| {
                parse_template(template)
                    .map(|parts| (name.clone(), parts))
                    .map_err(|why| format!("{name} = {template:?}: {why}"))
            })
            .collect::<Result<_, _>>()?;
        Ok(BranchEnv { vars })
    }

    /// Whether it maps nothing.
    pub fn is_empty(&self) -> bool {
        self.vars.is_empty()
    }

    /// The variables for the branch `conn`.
    pub fn render(&self, conn: &ConnectInfo) -> Vec<(String, String)> {
        self.vars
            .iter()
            .map(|(name, parts)| {
                let value = parts
                    .iter()
                    .map(|p| match p {
                        Part::Text(t) => t.clone(),
                        Part::Field(f) => Field::of(conn, *f),
                    })
                    .collect();
                (name.clone(), value)
            })
            .collect()
    }
}

fn parse_template(template: &str) -> Result<Vec<Part>, String> {
    let mut parts = Vec::new();
    let mut text = String::new();
    let mut rest = template;
    while let Some(c) = rest.chars().next() {
        if let Some(after) = rest.strip_prefix("{{") {
            text.push('{');
            rest = after;
        } else if let Some(after) = rest.strip_prefix("}}") {
            text.push('}');
            rest = after;
        } else if c == '{' {
            let end = rest
                .find('}')
                .ok_or_else(|| "a `{` is never closed (write `{{` for a brace)".to_string())?;
            let name = &rest[1..end];
            let field = Field::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, f)| *f)
                .ok_or_else(|| {
                    format!(
                        "`{{{name}}}` is no field of the branch (the fields: {})",
                        Field::ALL
                            .iter()
                            .map(|(n, _)| format!("{{{n}}}"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })?;
            if !text.is_empty() {
                parts.push(Part::Text(std::mem::take(&mut text)));
            }
            parts.push(Part::Field(field));
            rest = &rest[end + 1..];
        } else if c == '}' {
            return Err("a `}` closes nothing (write `}}` for a brace)".into());
        } else {
            text.push(c);
            rest = &rest[c.len_utf8()..];
        }
    }
    if !text.is_empty() {
        parts.push(Part::Text(text));
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::{Secret, SslMode};

    fn conn() -> ConnectInfo {
        ConnectInfo {
            host: "127.0.0.1".into(),
            port: 5433,
            database: "consort_b1".into(),
            user: "branch_b1".into(),
            secret: Secret::new("p@ss".to_string()),
            expires_at: None,
            sslmode: SslMode::Disable,
            ca_file: None,
        }
    }

    fn env(pairs: &[(&str, &str)]) -> Result<BranchEnv, String> {
        let owned: Vec<(String, String)> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        BranchEnv::parse(owned.iter().map(|(k, v)| (k, v)))
    }

    #[test]
    fn templates_render_the_branch_under_the_project_s_names() {
        let e = env(&[
            ("DB_HOST", "{host}"),
            ("DB_PORT", "{port}"),
            (
                "SQLALCHEMY_URL",
                "postgresql+psycopg://{user}:{password}@{host}:{port}/{database}",
            ),
            ("BRACES", "{{literal}} {sslmode}"),
            ("URL", "{url}"),
        ])
        .expect("valid");
        let got = e.render(&conn());
        let get = |k: &str| got.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("DB_HOST"), Some("127.0.0.1"));
        assert_eq!(get("DB_PORT"), Some("5433"));
        assert_eq!(
            get("SQLALCHEMY_URL"),
            Some("postgresql+psycopg://branch_b1:p@ss@127.0.0.1:5433/consort_b1")
        );
        assert_eq!(get("BRACES"), Some("{literal} disable"));
        assert_eq!(get("URL"), Some(conn().database_url().expose()));
    }

    #[test]
    fn an_unknown_field_or_an_open_brace_is_refused_naming_the_variable() {
        let e = env(&[("DB", "{hostname}")]).expect_err("unknown");
        assert!(
            e.contains("DB = \"{hostname}\"") && e.contains("{host}, {port}"),
            "{e}"
        );
        let e = env(&[("DB", "x{host")]).expect_err("open");
        assert!(e.contains("never closed"), "{e}");
        let e = env(&[("DB", "x}")]).expect_err("stray");
        assert!(e.contains("closes nothing"), "{e}");
        assert!(env(&[]).expect("empty").is_empty());
    }
}
