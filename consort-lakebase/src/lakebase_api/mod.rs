//! The Lakebase Autoscaling backend: a REST client for `/api/2.0/postgres/…` and the
//! [`LakebaseProvider`] that implements [`crate::provider::BranchProvider`] on it.
//!
//! Layers, from the wire up (so that a Neon adapter can sit beside this one and share the
//! lower two):
//! * [`http`] — bearer auth, base-URL rules, retries on 429/503 honouring `Retry-After`,
//!   size-capped bodies, error bodies (`{error_code, message}` or `{code, message}`) mapped to
//!   [`ApiError`], token scrubbing; [`retry`] holds the budgets; [`naming`] and [`time`] the
//!   shared naming and timestamp rules.
//! * [`types`] and [`client`] — Lakebase's JSON shapes and calls: branches, long-running
//!   operations, endpoints, credentials.
//! * [`provider`] — branch semantics: bases, TTLs, login probing, credential caching, sweep;
//!   [`base`] fills base branches; [`connect()`] opens TLS (or loopback-only plaintext)
//!   connections.

mod base;
mod client;
mod connect;
mod error;
mod http;
mod naming;
mod provider;
mod retry;
mod time;
pub mod types;

pub use base::{BaseBuilder, SqlBaseBuilder};
pub use client::LakebaseClient;
pub use connect::connect;
pub use error::ApiError;
pub use http::RestClient;
pub use provider::{LakebaseConfig, LakebaseProvider};
pub use retry::{AuthReadyPolicy, PollPolicy, RetryPolicy};
