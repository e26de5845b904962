//! Building a base branch's contents: the migrations and fixtures of a [`BaseSpec`].
//!
//! The provider owns *where* the base lives (a `no_expiry` branch); a [`BaseBuilder`] owns
//! *what* goes in it. The default, [`SqlBaseBuilder`], applies the migrations with the
//! crate's [`crate::migrate`] (each in its own transaction, recorded with its checksum in
//! `consort_migrations`), then runs each fixture in its own transaction. Swap in another
//! builder with [`super::LakebaseProvider::with_base_builder`].

use std::fmt;

use crate::error::{Error, Result};
use crate::migrate;
use crate::provider::{BaseSpec, BoxFuture};

/// Fills a freshly created base branch from a spec.
pub trait BaseBuilder: Send + Sync + fmt::Debug {
    /// Applies `spec` on `client` (connected to the new base branch).
    fn build<'a>(
        &'a self,
        client: &'a mut tokio_postgres::Client,
        spec: &'a BaseSpec,
    ) -> BoxFuture<'a, Result<()>>;
}

/// Migrations through [`crate::migrate::apply`], then fixtures, one transaction each.
#[derive(Debug, Clone, Copy, Default)]
pub struct SqlBaseBuilder;

impl BaseBuilder for SqlBaseBuilder {
    fn build<'a>(
        &'a self,
        client: &'a mut tokio_postgres::Client,
        spec: &'a BaseSpec,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move {
            migrate::apply(client, &spec.migrations).await?;
            for (i, fx) in spec.fixtures.iter().enumerate() {
                let what = format!("fixture #{}", i + 1);
                let fail = |e: tokio_postgres::Error| Error::Migration {
                    version: what.clone(),
                    detail: e
                        .as_db_error()
                        .map(|d| format!("{} (SQLSTATE {})", d.message(), d.code().code()))
                        .unwrap_or_else(|| consort_actors::error_chain(&e)),
                };
                let tx = client.transaction().await.map_err(fail)?;
                tx.batch_execute(fx).await.map_err(fail)?;
                tx.commit().await.map_err(fail)?;
            }
            Ok(())
        })
    }
}
