//! Connecting to a branch's PostgreSQL endpoint: TLS by default (rustls, the web PKI roots and
//! a configured CA file, certificate and host name verified), plaintext only to loopback
//! hosts, and the classification of login errors: only those a freshly created branch shows
//! for a while are worth retrying; a `pg_hba.conf` refusal or a TLS failure is not.

use std::error::Error as _;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::error::{ApiConfigError, ApiError};
use super::http::is_loopback_host;
use crate::provider::{ConnectInfo, SslMode};

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Opens a connection described by `info` and drives it on a background task (it ends when
/// the returned client is dropped).
///
/// `SslMode::Require` uses rustls with the Mozilla (web PKI) roots and `info.ca_file`, and
/// verifies the certificate and the host name; `SslMode::Disable` is refused unless the host
/// is a loopback address.
pub async fn connect(info: &ConnectInfo) -> Result<tokio_postgres::Client, ApiError> {
    connect_raw(info).await.map_err(|e| match e {
        ConnectFailure::Refused(e) => e,
        ConnectFailure::Postgres(e) => ApiError::postgres(
            format!(
                "connecting to {}:{}/{}",
                info.host, info.port, info.database
            ),
            &e,
        ),
    })
}

/// Why a connection failed: refused by our own rules, or by the network or server.
#[derive(Debug)]
pub(crate) enum ConnectFailure {
    /// Our rules refused it (plaintext to a remote host).
    Refused(ApiError),
    /// The driver or server failed.
    Postgres(tokio_postgres::Error),
}

pub(crate) async fn connect_raw(
    info: &ConnectInfo,
) -> Result<tokio_postgres::Client, ConnectFailure> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(&info.host)
        .port(info.port)
        .user(&info.user)
        .password(info.secret.expose())
        .dbname(&info.database)
        .application_name("consort")
        .connect_timeout(CONNECT_TIMEOUT);
    match info.sslmode {
        SslMode::Disable => {
            if !is_loopback_host(&info.host) {
                return Err(ConnectFailure::Refused(
                    ApiConfigError::PlaintextConnection {
                        host: info.host.clone(),
                    }
                    .into(),
                ));
            }
            cfg.ssl_mode(tokio_postgres::config::SslMode::Disable);
            let (client, conn) = cfg
                .connect(tokio_postgres::NoTls)
                .await
                .map_err(ConnectFailure::Postgres)?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("postgres connection ended: {e}");
                }
            });
            Ok(client)
        }
        SslMode::Require => {
            let tls = crate::tls::connector(info.ca_file.as_deref())
                .map_err(|e| ConnectFailure::Refused(ApiConfigError::CaFile(e).into()))?;
            cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
            let (client, conn) = cfg.connect(tls).await.map_err(ConnectFailure::Postgres)?;
            tokio::spawn(async move {
                if let Err(e) = conn.await {
                    tracing::debug!("postgres connection ended: {e}");
                }
            });
            Ok(client)
        }
    }
}

/// Whether a login failure is the kind a freshly created branch shows for a while
/// ("External authorization failed", a rejected token, the database or compute not there
/// yet, the connection refused), so that retrying with a fresh credential makes sense.
pub(crate) fn is_login_window_error(e: &tokio_postgres::Error) -> bool {
    if e.to_string()
        .to_ascii_lowercase()
        .contains("external authorization failed")
    {
        return true;
    }
    if let Some(db) = e.as_db_error() {
        if db
            .message()
            .to_ascii_lowercase()
            .contains("external authorization failed")
        {
            return true;
        }
        // 28000 without "external authorization" is a `pg_hba.conf` refusal: it stays.
        let code = db.code();
        return *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS;
    }
    if is_tls_error(e) {
        return false;
    }
    // Network-level: only "not up yet" kinds, never TLS or protocol failures.
    let mut source = e.source();
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            return matches!(
                io.kind(),
                ConnectionRefused | ConnectionReset | ConnectionAborted | TimedOut | NotConnected
            );
        }
        source = s.source();
    }
    // A connect timeout is reported without an io::Error source.
    e.to_string().contains("timed out")
}

/// Whether the server refused the password (SQLSTATE 28P01): with a cached credential, one
/// the server revoked.
pub(crate) fn is_refused_password(e: &tokio_postgres::Error) -> bool {
    e.as_db_error()
        .is_some_and(|db| *db.code() == SqlState::INVALID_PASSWORD)
}

/// Whether the connection failed in its TLS handshake (an unknown issuer, another host's
/// certificate, no TLS on the server). The driver says so only in its message.
pub(crate) fn is_tls_error(e: &tokio_postgres::Error) -> bool {
    e.as_db_error().is_none() && {
        let text = e.to_string();
        text.contains("TLS") || text.contains("SSL")
    }
}
