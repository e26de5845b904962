//! The existing-server backend: template branching inside a PostgreSQL server given by a URL
//! (`CONSORT_DATABASE_URL` or configuration).
//!
//! The URL's user needs `SUPERUSER`, or `CREATEDB` and `CREATEROLE`. Its database is the
//! parent (unless [`ServerOptions::parent_database`] names another); the parent must exist and
//! must have no other sessions while a base is copied from it (SQLSTATE 55006 is retried for
//! [`ServerOptions::busy_timeout`]). Consort only ever creates, alters and drops databases and
//! roles it created itself (the `consort_`/`consorttpl_`/`consorttmp_` names carrying its JSON
//! marker comment), plus the `consortowner` role. The one change it makes to the parent is
//! `promote`, which applies migrations there (as `consortowner`, after granting that role
//! `USAGE, CREATE` on schema `public`). Objects that existed in the parent before are
//! visible in branches with the privileges granted to `consortowner` or `PUBLIC`.
//!
//! The URL's password never appears in `Debug` output or in errors.

use std::str::FromStr;

use tokio_postgres::Config;
use tokio_postgres::config::Host;

use crate::error::{Error, Result};
use crate::pgbranch::{PgBrancher, ServerOptions, ServerTarget};
use crate::provider::{Secret, SslMode};

/// The environment variable holding the server URL.
pub const DATABASE_URL_ENV: &str = "CONSORT_DATABASE_URL";

/// Template branching inside an existing server.
#[derive(Debug)]
pub struct PostgresUrlProvider {
    inner: PgBrancher,
}

/// Replaces every occurrence of the URL's password (raw and percent-decoded) in `text`.
fn scrub(text: &str, url: &str) -> String {
    let Some(rest) = url.split_once("://").map(|(_, r)| r) else {
        return text.to_string();
    };
    let authority = rest.split('/').next().unwrap_or("");
    let Some((userinfo, _)) = authority.rsplit_once('@') else {
        return text.to_string();
    };
    let Some((_, password)) = userinfo.split_once(':') else {
        return text.to_string();
    };
    if password.is_empty() {
        return text.to_string();
    }
    text.replace(password, "***")
}

impl PostgresUrlProvider {
    /// Reads the URL from `CONSORT_DATABASE_URL`.
    pub async fn from_env(opts: ServerOptions) -> Result<Self> {
        let url = std::env::var(DATABASE_URL_ENV)
            .map_err(|_| Error::Config(format!("{DATABASE_URL_ENV} is not set")))?;
        Self::connect(&Secret::new(url), opts).await
    }

    /// Connects to the server at `url` (`postgresql://user:password@host:port/parent`).
    pub async fn connect(url: &Secret, opts: ServerOptions) -> Result<Self> {
        let raw = url.expose();
        let cfg = Config::from_str(raw).map_err(|e| {
            Error::Config(format!(
                "not a valid PostgreSQL URL: {}",
                scrub(&e.to_string(), raw)
            ))
        })?;
        let (host, host_is_local) = match cfg.get_hosts().first() {
            Some(Host::Tcp(h)) => (
                h.clone(),
                h == "localhost"
                    || h.parse::<std::net::IpAddr>()
                        .is_ok_and(|ip| ip.is_loopback()),
            ),
            Some(Host::Unix(p)) => (p.display().to_string(), true),
            None => {
                return Err(Error::Config("the database URL names no host".into()));
            }
        };
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        let user = cfg
            .get_user()
            .ok_or_else(|| Error::Config("the database URL names no user".into()))?
            .to_string();
        let parent = opts
            .parent_database
            .clone()
            .or_else(|| cfg.get_dbname().map(str::to_string))
            .unwrap_or_else(|| user.clone());
        let ssl = match cfg.get_ssl_mode() {
            tokio_postgres::config::SslMode::Require => SslMode::Require,
            tokio_postgres::config::SslMode::Disable => SslMode::Disable,
            _ if host_is_local => SslMode::Disable,
            _ => SslMode::Require,
        };
        let target = ServerTarget {
            kind: "postgres-url",
            admin: cfg,
            admin_ssl: ssl,
            parent,
            branch_host: host,
            branch_port: port,
            branch_ssl: ssl,
            manage_parent: false,
        };
        let inner = PgBrancher::init(target, opts).await.map_err(|e| match e {
            Error::Connect(t) => Error::Connect(scrub(&t, raw)),
            other => other,
        })?;
        Ok(PostgresUrlProvider { inner })
    }

    /// The parent database's name.
    pub fn parent_database(&self) -> &str {
        self.inner.parent()
    }

    /// A server reached by URL keeps no private state on this machine.
    fn private_dirs(&self) -> Vec<std::path::PathBuf> {
        Vec::new()
    }
}

crate::pgbranch::branch_provider_via_pg_brancher!(PostgresUrlProvider, typical_create_ms = 80);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::embedded::{EmbeddedConfig, EmbeddedPostgres};
    use crate::names::BranchNamer;
    use crate::provider::{BaseSpec, BranchProvider};
    use consort_actors::Migration;
    use std::time::Duration;

    #[test]
    fn passwords_are_scrubbed_from_texts() {
        let url = "postgresql://app:s3cr%21t@db.example:5432/app";
        assert_eq!(
            scrub("failed for app:s3cr%21t@db", url),
            "failed for app:***@db"
        );
        assert_eq!(scrub("nothing here", url), "nothing here");
    }

    #[tokio::test]
    async fn branches_inside_an_existing_server_without_touching_foreign_databases() {
        let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary())
            .await
            .expect("cluster");
        let admin = crate::pgconn::connect(&cluster.admin_info("postgres"))
            .await
            .expect("admin");
        // An application role (not a superuser) that owns the parent, as on a shared server.
        for sql in [
            "CREATE ROLE appuser LOGIN CREATEDB CREATEROLE PASSWORD 'app-Secret-42'",
            "CREATE DATABASE app OWNER appuser",
            "CREATE DATABASE consort_not_ours_1",
        ] {
            admin.batch_execute(sql).await.expect("setup");
        }
        let url = Secret::new(format!(
            "postgresql://appuser:app-Secret-42@127.0.0.1:{}/app?sslmode=disable",
            cluster.port()
        ));
        let p = PostgresUrlProvider::connect(&url, ServerOptions::default())
            .await
            .expect("connect");
        assert_eq!(p.parent_database(), "app");
        assert_eq!(p.kind(), "postgres-url");
        assert!(!format!("{p:?}").contains("app-Secret-42"));

        let migrations = vec![Migration {
            version: "0001_notes".into(),
            story_id: "S1".into(),
            description: String::new(),
            sql: "CREATE TABLE notes (id int PRIMARY KEY, body text)".into(),
        }];
        let base = p
            .prepare_base(&BaseSpec {
                migrations: migrations.clone(),
                fixtures: vec!["INSERT INTO notes VALUES (1, 'fixture')".into()],
            })
            .await
            .expect("base");
        let namer = BranchNamer::new();
        let a = p.create(&namer.next_name(), &base).await.expect("a");
        let b = p.create(&namer.next_name(), &base).await.expect("b");
        let ia = p.connect_info(&a).await.expect("info");
        let ca = crate::pgconn::connect(&ia).await.expect("connect a");
        ca.batch_execute("INSERT INTO notes VALUES (2, 'in a')")
            .await
            .expect("write a");
        let cb = crate::pgconn::connect(&p.connect_info(&b).await.expect("info"))
            .await
            .expect("connect b");
        let n: i64 = cb
            .query_one("SELECT count(*) FROM notes", &[])
            .await
            .expect("count")
            .get(0);
        assert_eq!(n, 1, "b has the fixture row only");
        drop((ca, cb));

        // Foreign databases with the prefix are neither deleted nor swept.
        assert!(matches!(
            p.delete("consort-not-ours-1").await,
            Err(Error::PermissionDenied(_))
        ));
        assert_eq!(p.sweep(Duration::ZERO).await.expect("sweep"), 2);
        let still: i64 = admin
            .query_one(
                "SELECT count(*) FROM pg_database WHERE datname IN ('consort_not_ours_1', 'app')",
                &[],
            )
            .await
            .expect("count")
            .get(0);
        assert_eq!(still, 2);

        // Promote reaches the URL's database.
        let out = p.promote(&migrations).await.expect("promote");
        assert_eq!(out.target, "app");
        assert!(out.verified);

        // A wrong password: a clear error without the password.
        let bad = Secret::new(format!(
            "postgresql://appuser:wrong-Pass-77@127.0.0.1:{}/app",
            cluster.port()
        ));
        let err = PostgresUrlProvider::connect(&bad, ServerOptions::default())
            .await
            .expect_err("bad password");
        assert!(matches!(err, Error::Connect(_)), "{err}");
        assert!(!err.to_string().contains("wrong-Pass-77"), "{err}");
        let err = PostgresUrlProvider::connect(
            &Secret::new("postgresql://u:pw-Zz9@[bad"),
            ServerOptions::default(),
        )
        .await
        .expect_err("bad url");
        assert!(!err.to_string().contains("pw-Zz9"), "{err}");
    }
}
