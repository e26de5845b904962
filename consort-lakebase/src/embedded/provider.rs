//! [`BranchProvider`] over an [`EmbeddedCluster`].

use std::sync::Arc;

use super::cluster::EmbeddedCluster;
use crate::error::Result;
use crate::pgbranch::{PgBrancher, ServerOptions, ServerTarget};
use crate::pgconn::config_of;
use crate::provider::SslMode;

/// Template branching on an embedded cluster: the administrator connects over the Unix
/// socket, branches are reached over loopback TCP with their own password.
#[derive(Debug)]
pub struct EmbeddedProvider {
    cluster: Arc<EmbeddedCluster>,
    inner: PgBrancher,
}

impl EmbeddedProvider {
    /// A provider with the default options (parent database `consort`).
    pub async fn new(cluster: Arc<EmbeddedCluster>) -> Result<Self> {
        Self::with_options(cluster, ServerOptions::default()).await
    }

    /// A provider with explicit options.
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
        };
        let inner = PgBrancher::init(target, opts).await?;
        Ok(EmbeddedProvider { cluster, inner })
    }

    /// The cluster this provider branches in.
    pub fn cluster(&self) -> &Arc<EmbeddedCluster> {
        &self.cluster
    }

    /// The parent database's name.
    pub fn parent_database(&self) -> &str {
        self.inner.parent()
    }

    /// The cluster's directory and socket directory: private to the provider.
    fn private_dirs(&self) -> Vec<std::path::PathBuf> {
        vec![
            self.cluster.dir().to_path_buf(),
            self.cluster.socket_dir().to_path_buf(),
        ]
    }

    /// How often a busy source database (SQLSTATE 55006) was retried so far.
    pub fn busy_retries(&self) -> u64 {
        self.inner.busy_retries()
    }
}

crate::pgbranch::branch_provider_via_pg_brancher!(EmbeddedProvider, typical_create_ms = 50);
