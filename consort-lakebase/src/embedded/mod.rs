//! The embedded local PostgreSQL backend (the default): a private cluster started by Consort.
//!
//! ```no_run
//! # async fn demo() -> consort_lakebase::Result<()> {
//! use std::sync::Arc;
//! use consort_lakebase::{BranchProvider, EmbeddedConfig, EmbeddedPostgres, EmbeddedProvider};
//! let cluster = EmbeddedPostgres::start(EmbeddedConfig::temporary()).await?;
//! let provider: Arc<dyn BranchProvider> = Arc::new(EmbeddedProvider::new(cluster).await?);
//! # Ok(()) }
//! ```

pub(crate) mod branch_space;
mod cluster;
mod orphans;
mod owner;
mod provider;
mod reflink;
mod runas;

pub use cluster::{EmbeddedCluster, EmbeddedConfig, EmbeddedPostgres};
pub(crate) use orphans::size_of;
pub use orphans::{PlacedCluster, Placement, placed_clusters, remove_orphan};
pub use provider::EmbeddedProvider;
pub use runas::{RunAs, fallback_dir};
