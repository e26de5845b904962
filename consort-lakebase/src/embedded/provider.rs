//! [`BranchProvider`] over an [`EmbeddedCluster`].

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use consort_actors::Migration;

use super::cluster::EmbeddedCluster;
use crate::error::Result;
use crate::pgbranch::{PgBrancher, ServerOptions, ServerTarget};
use crate::pgconn::config_of;
use crate::provider::{
    BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo,
    PromoteOutcome, SslMode,
};

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

    /// How often a busy source database (SQLSTATE 55006) was retried so far.
    pub fn busy_retries(&self) -> u64 {
        self.inner.busy_retries()
    }
}

impl BranchProvider for EmbeddedProvider {
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            point_in_time: false,
            native_reset: false,
            server_ttl: false,
            max_live_branches: None,
            typical_create_ms: 50,
        }
    }

    fn prepare_base<'a>(&'a self, spec: &'a BaseSpec) -> BoxFuture<'a, Result<BaseRef>> {
        Box::pin(self.inner.prepare_base(spec))
    }

    fn create<'a>(&'a self, name: &'a str, from: &'a BaseRef) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(self.inner.create(name, from))
    }

    fn connect_info<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<ConnectInfo>> {
        Box::pin(self.inner.connect_info(branch))
    }

    fn reset<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(self.inner.reset(branch))
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.inner.delete(name))
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Branch>>> {
        Box::pin(self.inner.list(prefix))
    }

    fn sweep(&self, older_than: Duration) -> BoxFuture<'_, Result<usize>> {
        Box::pin(self.inner.sweep(older_than))
    }

    fn sweep_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(self.inner.sweep_orphans())
    }

    fn keep_for_inspection<'a>(
        &'a self,
        branch: &'a Branch,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(self.inner.keep_for_inspection(branch, until))
    }

    fn promote<'a>(&'a self, migrations: &'a [Migration]) -> BoxFuture<'a, Result<PromoteOutcome>> {
        Box::pin(self.inner.promote(migrations))
    }
}
