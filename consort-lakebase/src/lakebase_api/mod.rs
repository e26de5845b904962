//! The Lakebase Autoscaling backend: a REST client for `/api/2.0/postgres/…` and the
//! [`LakebaseProvider`] that implements [`crate::provider::BranchProvider`] on it.
//!
//! Layers, from the wire up (so that a Neon adapter can sit beside this one and share the
//! lower two):
//! * the REST client ([`RestClient`]) — bearer auth, base-URL rules, retries on 429/503
//!   honouring `Retry-After` (budgets in [`RetryPolicy`], [`PollPolicy`], [`AuthReadyPolicy`]),
//!   size-capped bodies, error bodies (`{error_code, message}` or `{code, message}`) mapped to
//!   [`ApiError`], token scrubbing; shared naming and timestamp rules beside it.
//! * [`types`] and [`LakebaseClient`] — Lakebase's JSON shapes and calls: branches,
//!   long-running operations, endpoints, credentials.
//! * [`LakebaseProvider`] — branch semantics: bases, TTLs, login probing, credential caching,
//!   sweep; [`BaseBuilder`] fills base branches; [`connect()`] opens TLS (or loopback-only
//!   plaintext) connections.

mod base;
mod client;
mod connect;
mod error;
mod http;
mod naming;
mod oauth;
mod provider;
mod retry;
mod time;
pub mod types;

pub use base::{BaseBuilder, SqlBaseBuilder};
pub use client::LakebaseClient;
pub use connect::connect;
pub use error::{ApiConfigError, ApiError, UrlParseError};
pub use http::RestClient;
pub use oauth::OAuthClient;
pub use provider::{
    ENV_CLIENT_ID, ENV_CLIENT_SECRET, ENV_DATABASE, ENV_HOST, ENV_PROJECT, ENV_SOURCE_BRANCH,
    ENV_TOKEN, ENV_USER, ENV_WORKSPACE_ID, LakebaseConfig, LakebaseProvider,
};
pub use retry::{AuthReadyPolicy, PollPolicy, RetryPolicy};
