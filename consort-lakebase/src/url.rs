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

use crate::error::{ConfigError, Result};
use crate::pgbranch::{ServerOptions, ServerProvider, ServerTarget};
use crate::provider::{ConnectInfo, Secret, SslMode};

/// The environment variable holding the server URL.
pub const DATABASE_URL_ENV: &str = "CONSORT_DATABASE_URL";

/// Template branching inside an existing server.
///
/// The same type as [`EmbeddedProvider`](crate::EmbeddedProvider): both are a
/// [`ServerProvider`], built by [`PostgresUrlProvider::connect`] /
/// [`PostgresUrlProvider::from_env`] here.
pub type PostgresUrlProvider = ServerProvider;

/// Typical create time of a branch in a server reached over the network.
const URL_CREATE_MS: u64 = 80;

/// Replaces every occurrence of the URL's password (raw and percent-decoded) in `text`.
fn scrub(text: &str, url: &str) -> String {
    let Some(rest) = url.split_once("://").map(|(_, r)| r) else {
        return text.to_string();
    };
    let authority = rest
        .split_once('/')
        .map_or(rest, |(authority, _)| authority);
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

impl ServerProvider {
    /// Reads the URL from `CONSORT_DATABASE_URL`.
    pub async fn from_env(opts: ServerOptions) -> Result<Self> {
        let url = std::env::var(DATABASE_URL_ENV).map_err(|e| match e {
            std::env::VarError::NotPresent => ConfigError::EnvUnset {
                var: DATABASE_URL_ENV,
            },
            // Its value is not shown: the URL holds the password.
            std::env::VarError::NotUnicode(_) => ConfigError::EnvNotUnicode {
                var: DATABASE_URL_ENV,
            },
        })?;
        Self::connect(&Secret::new(url), opts).await
    }

    /// Connects to the server at `url` (`postgresql://user:password@host:port/parent`).
    pub async fn connect(url: &Secret, opts: ServerOptions) -> Result<Self> {
        let raw = url.expose();
        // The parser's error is kept as scrubbed text, not as a source: it may quote the URL.
        let cfg = Config::from_str(raw).map_err(|e| ConfigError::DatabaseUrl {
            detail: scrub(&e.to_string(), raw),
        })?;
        let (host, port, ssl) = endpoint_of(&cfg)?;
        let user = cfg
            .get_user()
            .ok_or(ConfigError::DatabaseUrlIncomplete { part: "user" })?
            .to_string();
        let parent = opts
            .parent_database
            .clone()
            .or_else(|| cfg.get_dbname().map(str::to_string))
            .unwrap_or_else(|| user.clone());
        let target = ServerTarget {
            kind: "postgres-url",
            admin: cfg,
            admin_ssl: ssl,
            parent,
            branch_host: host,
            branch_port: port,
            branch_ssl: ssl,
            manage_parent: false,
            typical_create_ms: URL_CREATE_MS,
            cluster: None,
        };
        // The driver's errors never carry the password (it is only in `cfg`).
        ServerProvider::init(target, opts).await
    }
}

/// The host, port and TLS requirement a parsed URL names: no port means PostgreSQL's default
/// one, as for libpq; TLS is required off the local host unless the URL says otherwise.
fn endpoint_of(cfg: &Config) -> Result<(String, u16, SslMode)> {
    let (host, host_is_local) = match cfg.get_hosts().first() {
        Some(Host::Tcp(h)) => (
            h.clone(),
            h == "localhost"
                || h.parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| ip.is_loopback()),
        ),
        Some(Host::Unix(p)) => (p.display().to_string(), true),
        None => return Err(ConfigError::DatabaseUrlIncomplete { part: "host" }.into()),
    };
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    let ssl = match cfg.get_ssl_mode() {
        tokio_postgres::config::SslMode::Require => SslMode::Require,
        tokio_postgres::config::SslMode::Disable => SslMode::Disable,
        _ if host_is_local => SslMode::Disable,
        _ => SslMode::Require,
    };
    Ok((host, port, ssl))
}

/// How to reach the database a URL names (`postgresql://user:password@host:port/database`),
/// for a connection of Consort's own such as the shared store's. The URL's password is in
/// the answer's secret only, never in an error.
pub fn connect_info_of_url(url: &Secret) -> Result<ConnectInfo> {
    let raw = url.expose();
    let cfg = Config::from_str(raw).map_err(|e| ConfigError::DatabaseUrl {
        detail: scrub(&e.to_string(), raw),
    })?;
    let (_, _, ssl) = endpoint_of(&cfg)?;
    if cfg.get_user().is_none() {
        return Err(ConfigError::DatabaseUrlIncomplete { part: "user" }.into());
    }
    if cfg.get_dbname().is_none() {
        return Err(ConfigError::DatabaseUrlIncomplete { part: "database" }.into());
    }
    crate::pgconn::connect_info_of(&cfg, ssl)
        .ok_or_else(|| ConfigError::DatabaseUrlIncomplete { part: "host" }.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_scrubbed_from_texts() {
        let url = "postgresql://app:s3cr%21t@db.example:5432/app";
        assert_eq!(
            scrub("failed for app:s3cr%21t@db", url),
            "failed for app:***@db"
        );
        assert_eq!(scrub("nothing here", url), "nothing here");
    }
}
