//! Connecting to a branch's PostgreSQL endpoint: TLS by default (rustls, web PKI roots),
//! plaintext only to loopback hosts, and the classification of login errors that are worth
//! retrying right after a branch was created.

use std::error::Error as _;
use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::error::ApiError;
use super::http::is_loopback_host;
use crate::provider::{ConnectInfo, SslMode};

/// How long one connection attempt may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(15);

/// Opens a connection described by `info` and drives it on a background task (it ends when
/// the returned client is dropped).
///
/// `SslMode::Require` uses rustls with the Mozilla (web PKI) roots and verifies the
/// certificate; `SslMode::Disable` is refused unless the host is a loopback address.
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
                return Err(ConnectFailure::Refused(ApiError::Config(format!(
                    "refusing a plaintext connection to {}: only loopback hosts may skip TLS",
                    info.host
                ))));
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
            // rustls needs a process-wide provider for `ClientConfig::builder()`; installing
            // aws-lc-rs (the one reqwest uses too) is a no-op when one is already there.
            let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
            let tls = tokio_postgres_rustls::MakeRustlsConnect::with_webpki_roots();
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
        let code = db.code();
        return *code == SqlState::INVALID_PASSWORD
            || *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION
            || *code == SqlState::INVALID_CATALOG_NAME
            || *code == SqlState::CANNOT_CONNECT_NOW
            || *code == SqlState::TOO_MANY_CONNECTIONS;
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
