//! consort-lakebase on real PostgreSQL: the Lakebase actor, template branching on the shared
//! embedded cluster, the server backends on private clusters (`pgbranch`, `pool`: exact counts),
//! the runners on real processes and confined runs (`sandbox`), suites split over branches (`shards`), and the Lakebase REST client
//! against a loopback service (`lakebase_api`), and the shared store (`store`). `cluster.rs` is a binary of its own: it tests
//! what happens to servers when their owning process ends.

#[path = "../common/mod.rs"]
mod common;

mod actor;
mod branching;
mod lakebase_api;
mod pgbranch;
mod pool;
mod runners;
mod sandbox;
mod shards;
mod store;
