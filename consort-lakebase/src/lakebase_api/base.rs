//! Building a base branch's contents: the migrations and fixtures of a [`BaseSpec`].
//!
//! The provider owns *where* the base lives (a `no_expiry` branch); a [`BaseBuilder`] owns
//! *what* goes in it. The default, [`SqlBaseBuilder`], runs each migration in its own
//! transaction and records it in `consort_migrations`; swap in another builder (for example
//! the crate's migration runner) with [`super::LakebaseProvider::with_base_builder`].

use std::fmt;

use super::error::ApiError;
use crate::provider::{BaseSpec, BoxFuture};

/// Fills a freshly created base branch from a spec.
pub trait BaseBuilder: Send + Sync + fmt::Debug {
    /// Applies `spec` on `client` (connected to the new base branch).
    fn build<'a>(
        &'a self,
        client: &'a tokio_postgres::Client,
        spec: &'a BaseSpec,
    ) -> BoxFuture<'a, Result<(), ApiError>>;
}

/// Applies migrations (each in its own transaction, recorded with version and checksum in
/// `consort_migrations`) and then fixtures (one transaction each).
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlBaseBuilder;

fn pg(context: impl Into<String>, e: tokio_postgres::Error) -> ApiError {
    ApiError::postgres(context, &e)
}

async fn in_transaction(
    client: &tokio_postgres::Client,
    context: &str,
    sql: &str,
    record: Option<(&str, &str)>,
) -> Result<(), ApiError> {
    client
        .batch_execute("BEGIN")
        .await
        .map_err(|e| pg(context, e))?;
    let mut result = client.batch_execute(sql).await.map_err(|e| pg(context, e));
    if result.is_ok()
        && let Some((version, checksum)) = record
    {
        result = client
            .execute(
                "INSERT INTO consort_migrations (version, checksum) VALUES ($1, $2)",
                &[&version, &checksum],
            )
            .await
            .map(|_| ())
            .map_err(|e| pg(context, e));
    }
    match result {
        Ok(()) => client
            .batch_execute("COMMIT")
            .await
            .map_err(|e| pg(context, e)),
        Err(e) => {
            let _ = client.batch_execute("ROLLBACK").await;
            Err(e)
        }
    }
}

impl BaseBuilder for SqlBaseBuilder {
    fn build<'a>(
        &'a self,
        client: &'a tokio_postgres::Client,
        spec: &'a BaseSpec,
    ) -> BoxFuture<'a, Result<(), ApiError>> {
        Box::pin(async move {
            client
                .batch_execute(
                    "CREATE TABLE IF NOT EXISTS consort_migrations (\
                       version text PRIMARY KEY, \
                       checksum text NOT NULL, \
                       applied_at timestamptz NOT NULL DEFAULT now())",
                )
                .await
                .map_err(|e| pg("creating consort_migrations", e))?;
            for m in &spec.migrations {
                let checksum = m.checksum().to_hex();
                let row = client
                    .query_opt(
                        "SELECT checksum FROM consort_migrations WHERE version = $1",
                        &[&m.version],
                    )
                    .await
                    .map_err(|e| pg("reading consort_migrations", e))?;
                if let Some(row) = row {
                    let applied: String = row.get(0);
                    if applied == checksum {
                        continue;
                    }
                    return Err(ApiError::Postgres {
                        context: format!("migration {}", m.version),
                        code: None,
                        message: format!("already applied with checksum {applied}, now {checksum}"),
                    });
                }
                tracing::info!(version = %m.version, "applying migration to the base");
                in_transaction(
                    client,
                    &format!("migration {}", m.version),
                    &m.sql,
                    Some((&m.version, &checksum)),
                )
                .await?;
            }
            for (i, f) in spec.fixtures.iter().enumerate() {
                in_transaction(client, &format!("fixture {}", i + 1), f, None).await?;
            }
            Ok(())
        })
    }
}
