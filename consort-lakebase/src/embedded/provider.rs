//! [`EmbeddedProvider`]: template branching on an [`EmbeddedCluster`].

use std::sync::Arc;

use super::cluster::EmbeddedCluster;
use crate::error::Result;
use crate::pgbranch::{ServerOptions, ServerProvider, ServerTarget};
use crate::pgconn::config_of;
use crate::provider::SslMode;

/// Template branching on an embedded cluster: the administrator connects over the Unix
/// socket, branches are reached over loopback TCP with their own password. The cluster's
/// directories are the provider's private paths.
///
/// The same type as [`PostgresUrlProvider`](crate::PostgresUrlProvider): both are a
/// [`ServerProvider`], built by [`EmbeddedProvider::new`] / [`EmbeddedProvider::with_options`]
/// here.
pub type EmbeddedProvider = ServerProvider;

/// Typical create time of a branch on an embedded cluster.
const EMBEDDED_CREATE_MS: u64 = 50;

impl ServerProvider {
    /// A provider on `cluster` with the default options (parent database `consort`).
    pub async fn new(cluster: Arc<EmbeddedCluster>) -> Result<Self> {
        Self::with_options(cluster, ServerOptions::default()).await
    }

    /// A provider on `cluster` with explicit options.
    pub async fn with_options(cluster: Arc<EmbeddedCluster>, opts: ServerOptions) -> Result<Self> {
        let parent = opts
            .parent_database
            .clone()
            .unwrap_or_else(|| "consort".to_string());
        let target = ServerTarget {
            kind: "embedded",
            admin: config_of(&cluster.admin_info(&opts.maintenance_database)),
            admin_ssl: SslMode::Disable,
            parent,
            branch_host: "127.0.0.1".into(),
            branch_port: cluster.port(),
            branch_ssl: SslMode::Disable,
            manage_parent: true,
            typical_create_ms: EMBEDDED_CREATE_MS,
            cluster: Some(cluster),
        };
        ServerProvider::init(target, opts).await
    }
}
