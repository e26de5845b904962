//! One embedded PostgreSQL cluster per test binary.
//!
//! The cluster is started on first use and shared by every test of the binary. It does not
//! depend on the runtime that started it (each `#[tokio::test]` has its own): it is stopped
//! when the binary exits, by the cluster's owner watchdog, which sees this process's lifeline
//! pipe close (or earlier by [`stop`]). Providers hold connections bound to the runtime that
//! made them, so each test makes its own with [`provider`] or [`provider_on`].

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use consort_lakebase::{
    Branch, BranchProvider, ConnectInfo, EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres,
    EmbeddedProvider, Secret, ServerOptions, SslMode,
};
use tokio::sync::OnceCell;

static CLUSTER: OnceCell<Arc<EmbeddedCluster>> = OnceCell::const_new();

/// The binary's shared cluster (started on the first call).
pub async fn cluster() -> Arc<EmbeddedCluster> {
    CLUSTER
        .get_or_init(|| async {
            EmbeddedPostgres::start(EmbeddedConfig::temporary())
                .await
                .expect("start the shared embedded cluster")
        })
        .await
        .clone()
}

/// A provider on the shared cluster, with the default parent database.
pub async fn provider() -> Arc<EmbeddedProvider> {
    Arc::new(
        EmbeddedProvider::new(cluster().await)
            .await
            .expect("embedded provider"),
    )
}

/// A fresh database of its own on the shared cluster (a branch of an empty base), for a test
/// that needs one database and no provider: the shared store's, for one.
pub async fn scratch_database() -> ConnectInfo {
    let p = provider().await;
    fresh_branch(&*p, &consort_lakebase::BaseSpec::default())
        .await
        .1
}

/// A fresh branch on `p` of a base built from `spec`, and how to connect to it.
pub async fn fresh_branch<P: BranchProvider + ?Sized>(
    p: &P,
    spec: &consort_lakebase::BaseSpec,
) -> (Branch, ConnectInfo) {
    let base = p.prepare_base(spec).await.expect("base");
    let branch = p
        .create(
            &consort_lakebase::names::BranchNamer::new().next_name(),
            &base,
        )
        .await
        .expect("branch");
    let info = p.connect_info(&branch).await.expect("info");
    (branch, info)
}

/// The same, as a trait object.
pub async fn dyn_provider() -> Arc<dyn BranchProvider> {
    provider().await
}

/// A provider on the shared cluster whose branches come from their own parent database
/// `parent` (so that tests which count or sweep branches do not see each other's).
pub async fn provider_on(parent: &str) -> Arc<EmbeddedProvider> {
    let opts = ServerOptions {
        parent_database: Some(parent.to_string()),
        ..ServerOptions::default()
    };
    Arc::new(
        EmbeddedProvider::with_options(cluster().await, opts)
            .await
            .expect("embedded provider"),
    )
}

/// A parent database name no other caller in this binary gets: `{prefix}_{n}`.
pub fn unique_database(prefix: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    format!("{prefix}_{}", NEXT.fetch_add(1, Ordering::SeqCst))
}

/// Stops the shared cluster if it was started (for harnesses that want it gone before they
/// print their summary). Returns what stopping said.
pub fn stop() -> Result<(), consort_lakebase::Error> {
    match CLUSTER.get() {
        Some(c) => c.stop(),
        None => Ok(()),
    }
}

/// A pool configuration of `size` standing branches, the rest default.
pub fn pool_config(size: usize) -> consort_lakebase::PoolConfig {
    consort_lakebase::PoolConfig {
        size,
        ..consort_lakebase::PoolConfig::default()
    }
}

/// A base of these migrations and no fixtures.
pub fn base_spec(migrations: Vec<consort_actors::Migration>) -> consort_lakebase::BaseSpec {
    consort_lakebase::BaseSpec {
        migrations,
        fixtures: vec![],
        promoted: Vec::new(),
    }
}

/// The superuser of `cluster` on `database`, over the cluster's Unix socket (the password is
/// in the cluster's directory, which this process made).
pub fn admin_info(cluster: &EmbeddedCluster, database: &str) -> ConnectInfo {
    let password = std::fs::read_to_string(cluster.dir().join("admin.pw"))
        .expect("the cluster's admin.pw (this process started the cluster)");
    ConnectInfo {
        host: cluster.socket_dir().display().to_string(),
        port: cluster.port(),
        database: database.into(),
        user: cluster.superuser().into(),
        secret: Secret::new(password.trim()),
        expires_at: None,
        sslmode: SslMode::Disable,
        ca_file: None,
    }
}

/// The superuser of `cluster` on `database` as a URL over loopback TCP (what a process with
/// only a URL, such as a worker given `[store]` or `[database]` by environment, connects with).
pub fn admin_url(cluster: &EmbeddedCluster, database: &str) -> String {
    let info = admin_info(cluster, database);
    format!(
        "postgres://{}:{}@127.0.0.1:{}/{database}",
        info.user,
        info.secret.expose(),
        info.port
    )
}

/// A fresh directory under /tmp named `prefix…`, with `mode`: 0o755 lets the server's user
/// reach what is below it (a cluster placed there stays there), 0o700 keeps it out.
pub fn tmp_dir(prefix: &str, mode: u32) -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new()
        .prefix(prefix)
        .tempdir_in("/tmp")
        .expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).expect("chmod");
    dir
}
