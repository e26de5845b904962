//! Opening `tokio_postgres` connections from a [`ConnectInfo`] (plain or rustls TLS).

use std::time::Duration;

use tokio_postgres::{Client, Config, NoTls};
use tracing::debug;

use crate::error::{Error, Result};
use crate::provider::{ConnectInfo, SslMode};

/// How long a connection attempt may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The `tokio_postgres` configuration for `info` (the secret goes into the config only).
pub(crate) fn config_of(info: &ConnectInfo) -> Config {
    let mut cfg = Config::new();
    cfg.host(&info.host)
        .port(info.port)
        .dbname(&info.database)
        .user(&info.user)
        .password(info.secret.expose())
        .application_name("consort")
        .connect_timeout(CONNECT_TIMEOUT);
    cfg
}

/// The [`ConnectInfo`] of a ready configuration (its first host and port), for a client
/// program such as psql; None when it names no host, user or database.
pub(crate) fn connect_info_of(cfg: &Config, sslmode: SslMode) -> Option<ConnectInfo> {
    use tokio_postgres::config::Host;
    let host = match cfg.get_hosts().first()? {
        Host::Tcp(name) => name.clone(),
        Host::Unix(dir) => dir.display().to_string(),
    };
    let password = match cfg.get_password() {
        Some(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        // No password: the server trusts the connection (a socket, peer authentication).
        None => String::new(),
    };
    Some(ConnectInfo {
        host,
        port: cfg.get_ports().first().copied().unwrap_or(DEFAULT_PORT),
        database: cfg.get_dbname()?.to_string(),
        user: cfg.get_user()?.to_string(),
        secret: crate::provider::Secret::new(password),
        expires_at: None,
        sslmode,
        ca_file: None,
    })
}

/// libpq's port when a configuration names none.
const DEFAULT_PORT: u16 = 5432;

/// Connects with `info`; the connection's driver task runs on the current runtime.
pub async fn connect(info: &ConnectInfo) -> Result<Client> {
    connect_config(&config_of(info), info.sslmode, info.ca_file.as_deref()).await
}

/// Connects with a ready configuration. `SslMode::Require` uses rustls with the web PKI roots
/// and the certificates of `ca_file`, verifying the certificate and the host name.
pub(crate) async fn connect_config(
    cfg: &Config,
    sslmode: SslMode,
    ca_file: Option<&std::path::Path>,
) -> Result<Client> {
    // A failure keeps the driver's error (and with it the server's message, detail and hint);
    // the target is described without the password.
    let failed = |driver| Error::Connection {
        context: format!("connecting to {}", describe(cfg)),
        driver,
    };
    match sslmode {
        SslMode::Disable => {
            let (client, conn) = cfg.connect(NoTls).await.map_err(failed)?;
            drive(conn);
            Ok(client)
        }
        SslMode::Require => {
            let tls = crate::tls::connector(ca_file)?;
            let mut cfg = cfg.clone();
            cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, conn) = cfg.connect(tls).await.map_err(failed)?;
            drive(conn);
            Ok(client)
        }
    }
}

/// Runs a connection's driver on the current runtime until the connection ends.
fn drive<C>(conn: C)
where
    C: Future<Output = std::result::Result<(), tokio_postgres::Error>> + Send + 'static,
{
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            debug!(error = %consort_actors::error_chain(&e), "postgres connection ended");
        }
    });
}

/// `user@host:port/db` for messages (never the password); a part the configuration does not
/// name reads as `?` (the port as libpq's default).
pub(crate) fn describe(cfg: &Config) -> String {
    let host = cfg
        .get_hosts()
        .first()
        .map(|h| match h {
            tokio_postgres::config::Host::Tcp(s) => s.clone(),
            tokio_postgres::config::Host::Unix(p) => p.display().to_string(),
        })
        .unwrap_or_else(|| "?".into());
    let port = cfg.get_ports().first().copied().unwrap_or(5432);
    format!(
        "{}@{host}:{port}/{}",
        cfg.get_user().unwrap_or("?"),
        cfg.get_dbname().unwrap_or("?")
    )
}
