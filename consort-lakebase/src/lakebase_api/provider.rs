//! [`LakebaseProvider`]: the [`BranchProvider`] over Lakebase Autoscaling.
//!
//! * `prepare_base`: an empty spec uses the configured source branch (or the project's
//!   default branch) as the base, with no request beyond finding that branch. A spec with
//!   migrations or fixtures gets its own long-lived branch, `<prefix>-base-<key12>`, created
//!   with `no_expiry` (a branch that has children must not expire), filled by the
//!   [`BaseBuilder`] and marked complete in a `consort_base` table; a later call with the same
//!   spec reuses it, and a half-built one is deleted and rebuilt.
//! * `create`: `POST …/branches` with a TTL (a server-side backstop), poll the operation,
//!   ensure a read-write endpoint, then log in for real (retrying the short "External
//!   authorization failed" window with fresh credentials) before returning.
//! * `connect_info`: the endpoint host, the configured port, database and user, and a minted
//!   database token; the token is cached per endpoint and re-minted when it is within
//!   `credential_refresh_margin` of the expiry the service reported (never later than the
//!   lifetime asked for). A cached token is checked with a login before it is handed out, and
//!   minted again once when the server refuses it (28P01: the service ended it early).
//! * `reset` is delete + create (there is no reset API); `delete` purges and treats "not
//!   found" as done; `sweep` deletes only `<prefix>-…` branches older than the cut-off
//!   (children before bases, and never a base that still has children or that this process
//!   prepared); `sweep_orphans` deletes `<prefix>-…` branches whose expiry has passed (or,
//!   without an expiry, that are older than a day), so a branch kept for inspection lives
//!   until its new expiry.
//! * `keep_for_inspection` moves the branch's server-side expiry to the given time (`PATCH
//!   …?update_mask=spec.expiration`), so the service itself removes it then.
//! * `promote` applies migrations to the source branch (the parent) with
//!   [`crate::migrate`] and verifies them.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use consort_actors::ContentHash;

use super::base::{BaseBuilder, SqlBaseBuilder};
use super::client::LakebaseClient;
use super::connect::{
    ConnectFailure, connect_raw, is_login_window_error, is_refused_password, is_tls_error,
};
use super::error::{ApiConfigError, ApiError};
use super::http::{RestClient, is_loopback_host};
use super::naming::{
    duration_wire, has_owner_prefix, last_segment, validate_branch_id, validate_owned,
    validate_segment,
};
use super::retry::{AuthReadyPolicy, PollPolicy, RetryPolicy};
use super::time::{format_rfc3339, parse_rfc3339};
use super::types::{BranchResource, BranchSpec};
use crate::error::{Error, Result};
use crate::migrate;
use crate::provider::{
    BaseRef, BaseSpec, BoxFuture, Branch, BranchProvider, Capabilities, ConnectInfo,
    PromoteOutcome, Secret, SslMode,
};

/// Environment variable: the workspace URL (required by [`LakebaseConfig::from_env`]).
pub const ENV_HOST: &str = "DATABRICKS_HOST";
/// Environment variable: the bearer token (PAT or OAuth access token; required unless a
/// service principal's [`ENV_CLIENT_ID`] and [`ENV_CLIENT_SECRET`] are set).
pub const ENV_TOKEN: &str = "DATABRICKS_TOKEN";
/// Environment variable: a service principal's OAuth client id (with [`ENV_CLIENT_SECRET`]:
/// OAuth machine-to-machine instead of a bearer token).
pub const ENV_CLIENT_ID: &str = "DATABRICKS_CLIENT_ID";
/// Environment variable: a service principal's OAuth client secret.
pub const ENV_CLIENT_SECRET: &str = "DATABRICKS_CLIENT_SECRET";
/// Environment variable: sent as `X-Databricks-Workspace-Id` when set.
pub const ENV_WORKSPACE_ID: &str = "DATABRICKS_WORKSPACE_ID";
/// Environment variable: the Lakebase project id (required).
pub const ENV_PROJECT: &str = "CONSORT_LAKEBASE_PROJECT";
/// Environment variable: the branch to fork from (default: the project's default branch).
pub const ENV_SOURCE_BRANCH: &str = "CONSORT_LAKEBASE_SOURCE_BRANCH";
/// Environment variable: the Postgres user (default: the token's identity, from SCIM `Me`).
pub const ENV_USER: &str = "CONSORT_LAKEBASE_USER";
/// Environment variable: the database name (default `databricks_postgres`).
pub const ENV_DATABASE: &str = "CONSORT_LAKEBASE_DATABASE";

/// Configuration of the Lakebase backend. `token` is a [`Secret`]: `Debug` shows `***`.
#[derive(Debug, Clone, PartialEq)]
pub struct LakebaseConfig {
    /// Workspace URL, e.g. `https://adb-123.4.azuredatabricks.net` (a bare host gets
    /// `https://`; `http` only for loopback).
    pub host: String,
    /// Bearer token for the REST API (unused, and may be empty, with [`LakebaseConfig::oauth`]).
    pub token: Secret,
    /// A service principal's OAuth client: access tokens are bought from the workspace's
    /// OIDC token endpoint, cached, refreshed before they expire, and fetched again when the
    /// service refuses one. `None`: the bearer `token`.
    pub oauth: Option<super::oauth::OAuthClient>,
    /// A PEM file of CA certificates trusted for the branches' TLS beside the web roots (for a
    /// private CA); the certificate and host name are always verified.
    pub ca_file: Option<std::path::PathBuf>,
    /// How many branches may live at once in the project (the service's limit; default 10):
    /// the pool keeps its warm branches and concurrent runs within it.
    pub max_live_branches: usize,
    /// Optional `X-Databricks-Workspace-Id` header value.
    pub workspace_id: Option<String>,
    /// Lakebase project id.
    pub project: String,
    /// Branch id to fork bases from; `None` = the project's default branch.
    pub source_branch: Option<String>,
    /// Owner prefix of every branch Consort creates (`<prefix>-…`); default `consort`.
    pub prefix: String,
    /// Postgres user; `None` = the token's identity (`GET /api/2.0/preview/scim/v2/Me`).
    pub user: Option<String>,
    /// Database to connect to; default `databricks_postgres`. A `{branch}` in it is replaced
    /// by the branch id (for setups where one server stands in for many branches).
    pub database: String,
    /// Postgres port; default 5432.
    pub port: u16,
    /// Id of the read-write endpoint created when a branch has none; default `primary`.
    pub endpoint_id: String,
    /// Autoscaling minimum of a created endpoint, in compute units; default 0.5.
    pub endpoint_min_cu: f64,
    /// Autoscaling maximum of a created endpoint; default 2.
    pub endpoint_max_cu: f64,
    /// TTL of created branches (server-side backstop); default one hour.
    pub branch_ttl: Duration,
    /// Requested lifetime of database tokens (clamped to 300–3600 s); default one hour.
    pub credential_ttl: Duration,
    /// A cached token is re-minted when it expires within this; default two minutes.
    pub credential_refresh_margin: Duration,
    /// Allow plaintext Postgres connections, for loopback endpoint hosts only (tests). Any
    /// other host is refused while this is set. Default `false` (always `sslmode=require`).
    pub allow_plaintext_loopback: bool,
    /// Per-request HTTP timeout; default 60 s.
    pub request_timeout: Duration,
    /// Retries on 429/503 and connection failures.
    pub retry: RetryPolicy,
    /// Polling of long-running operations.
    pub poll: PollPolicy,
    /// Retrying the first login to a new branch.
    pub auth_ready: AuthReadyPolicy,
}

impl LakebaseConfig {
    /// A configuration with the defaults listed on each field.
    pub fn new(host: impl Into<String>, token: Secret, project: impl Into<String>) -> Self {
        LakebaseConfig {
            host: host.into(),
            token,
            oauth: None,
            ca_file: None,
            max_live_branches: 10,
            workspace_id: None,
            project: project.into(),
            source_branch: None,
            prefix: "consort".to_string(),
            user: None,
            database: "databricks_postgres".to_string(),
            port: 5432,
            endpoint_id: "primary".to_string(),
            endpoint_min_cu: 0.5,
            endpoint_max_cu: 2.0,
            branch_ttl: Duration::from_secs(3600),
            credential_ttl: Duration::from_secs(3600),
            credential_refresh_margin: Duration::from_secs(120),
            allow_plaintext_loopback: false,
            request_timeout: Duration::from_secs(60),
            retry: RetryPolicy::default(),
            poll: PollPolicy::default(),
            auth_ready: AuthReadyPolicy::default(),
        }
    }

    /// Reads the process environment: [`ENV_HOST`], [`ENV_PROJECT`] and either [`ENV_TOKEN`]
    /// or a service principal's [`ENV_CLIENT_ID`] and [`ENV_CLIENT_SECRET`] are required;
    /// [`ENV_WORKSPACE_ID`], [`ENV_SOURCE_BRANCH`], [`ENV_USER`] and [`ENV_DATABASE`] are
    /// optional.
    pub fn from_env() -> std::result::Result<Self, ApiError> {
        Self::from_lookup(|k| std::env::var(k).ok())
    }

    /// Like [`LakebaseConfig::from_env`] with a custom lookup (empty values count as unset).
    pub fn from_lookup(
        lookup: impl Fn(&str) -> Option<String>,
    ) -> std::result::Result<Self, ApiError> {
        let get = |k: &str| lookup(k).filter(|v| !v.trim().is_empty());
        let need = |var: &'static str| get(var).ok_or(ApiConfigError::EnvUnset { var });
        let oauth = match (get(ENV_CLIENT_ID), get(ENV_CLIENT_SECRET)) {
            (Some(id), Some(secret)) => Some(super::oauth::OAuthClient {
                client_id: id.trim().to_string(),
                client_secret: Secret::new(secret.trim()),
            }),
            (None, None) => None,
            _ => return Err(ApiConfigError::HalfServicePrincipal.into()),
        };
        let token = match (get(ENV_TOKEN), &oauth) {
            (Some(t), _) => Secret::new(t.trim()),
            (None, Some(_)) => Secret::new(""),
            (None, None) => return Err(ApiConfigError::NoCredentials.into()),
        };
        let mut cfg = LakebaseConfig::new(need(ENV_HOST)?, token, need(ENV_PROJECT)?);
        cfg.oauth = oauth;
        cfg.workspace_id = get(ENV_WORKSPACE_ID);
        cfg.source_branch = get(ENV_SOURCE_BRANCH);
        cfg.user = get(ENV_USER);
        if let Some(db) = get(ENV_DATABASE) {
            cfg.database = db;
        }
        Ok(cfg)
    }

    fn validate(&self) -> std::result::Result<(), ApiError> {
        validate_segment("project", &self.project)?;
        validate_segment("endpoint", &self.endpoint_id)?;
        if let Some(s) = &self.source_branch {
            validate_branch_id(s)?;
        }
        // The prefix must leave room for `-base-<12 hex>` and a suffix.
        validate_branch_id(&self.prefix)?;
        let broken = |setting, rule| Err(ApiConfigError::Setting { setting, rule }.into());
        if self.prefix.len() > 40 {
            return broken("the owner prefix", "must be at most 40 characters");
        }
        if self.database.trim().is_empty() || self.database.len() > 63 {
            return broken("the database name", "must be 1-63 bytes");
        }
        if self.max_live_branches < 2 {
            return broken(
                "max_live_branches",
                "must be at least 2 (a base and one branch)",
            );
        }
        if !(self.endpoint_min_cu > 0.0 && self.endpoint_min_cu <= self.endpoint_max_cu) {
            return broken("endpoint compute units", "must satisfy 0 < min <= max");
        }
        Ok(())
    }
}

#[derive(Debug, Clone)]
struct EndpointInfo {
    resource: String,
    host: String,
}

#[derive(Debug, Clone)]
struct CachedCredential {
    token: Secret,
    expires_at: SystemTime,
}

/// Whether a credential was minted by the call that returned it (or came from the cache).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Minted {
    Yes,
    No,
}

/// When a credential minted for `endpoint` with the lifetime `requested` expires: the expiry the
/// service reported, but never later than the lifetime asked for (the service grants at most
/// that). Without a readable expiry the lifetime asked for is assumed, and said in the log.
fn credential_expiry(endpoint: &str, reported: Option<&str>, requested: Duration) -> SystemTime {
    let now = SystemTime::now();
    let asked = now + requested.clamp(Duration::from_secs(300), Duration::from_secs(3600));
    match reported.map(|t| (t, parse_rfc3339(t))) {
        Some((_, Some(at))) => at.min(asked),
        Some((text, None)) => {
            tracing::warn!(
                endpoint,
                reported = %text.chars().take(40).collect::<String>(),
                "the service's credential expiry is not an RFC 3339 time; assuming the lifetime asked for"
            );
            asked
        }
        None => {
            tracing::warn!(
                endpoint,
                "the service reported no credential expiry; assuming the lifetime asked for"
            );
            asked
        }
    }
}

/// The Lakebase Autoscaling backend (see the module documentation for the semantics).
pub struct LakebaseProvider {
    cfg: LakebaseConfig,
    client: LakebaseClient,
    builder: Arc<dyn BaseBuilder>,
    user: tokio::sync::OnceCell<String>,
    source: tokio::sync::OnceCell<String>,
    endpoints: Mutex<HashMap<String, EndpointInfo>>,
    credentials: Mutex<HashMap<String, CachedCredential>>,
    bases: Mutex<HashMap<String, ContentHash>>,
    base_lock: tokio::sync::Mutex<()>,
}

impl fmt::Debug for LakebaseProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LakebaseProvider")
            .field("host", &self.cfg.host)
            .field("project", &self.cfg.project)
            .field("prefix", &self.cfg.prefix)
            .field("token", &self.cfg.token)
            .field("oauth", &self.cfg.oauth.as_ref().map(|o| &o.client_id))
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A host name from the service must be a plain DNS name or IP address (never a socket path
/// or anything with spaces or credentials in it).
fn check_host(branch: &str, host: &str) -> std::result::Result<(), ApiError> {
    let ok = !host.is_empty()
        && host.len() <= 253
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':' | '[' | ']'))
        && !host.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::Endpoint {
            branch: branch.to_string(),
            message: format!(
                "host `{}` is not a host name",
                host.chars().take(80).collect::<String>()
            ),
        })
    }
}

impl LakebaseProvider {
    /// A provider from a configuration (checked here; no request is sent yet).
    pub fn new(cfg: LakebaseConfig) -> std::result::Result<Self, ApiError> {
        cfg.validate()?;
        let mut rest = match &cfg.oauth {
            Some(client) => {
                RestClient::with_oauth(&cfg.host, client.clone(), cfg.retry, cfg.request_timeout)?
            }
            None => RestClient::new(&cfg.host, cfg.token.clone(), cfg.retry, cfg.request_timeout)?,
        };
        if let Some(ws) = &cfg.workspace_id {
            rest = rest.with_header("x-databricks-workspace-id", ws)?;
        }
        let client = LakebaseClient::new(rest, &cfg.project, cfg.poll)?;
        Ok(LakebaseProvider {
            cfg,
            client,
            builder: Arc::new(SqlBaseBuilder),
            user: tokio::sync::OnceCell::new(),
            source: tokio::sync::OnceCell::new(),
            endpoints: Mutex::new(HashMap::new()),
            credentials: Mutex::new(HashMap::new()),
            bases: Mutex::new(HashMap::new()),
            base_lock: tokio::sync::Mutex::new(()),
        })
    }

    /// A provider configured from the environment ([`LakebaseConfig::from_env`]).
    pub fn from_env() -> std::result::Result<Self, ApiError> {
        Self::new(LakebaseConfig::from_env()?)
    }

    /// Replaces the builder that fills base branches (default [`SqlBaseBuilder`]).
    pub fn with_base_builder(mut self, builder: Arc<dyn BaseBuilder>) -> Self {
        self.builder = builder;
        self
    }

    /// The configuration.
    pub fn config(&self) -> &LakebaseConfig {
        &self.cfg
    }

    /// The REST client underneath.
    pub fn client(&self) -> &LakebaseClient {
        &self.client
    }

    /// The Postgres user: configured, or the token's identity (asked once).
    pub async fn user(&self) -> std::result::Result<String, ApiError> {
        self.user
            .get_or_try_init(|| async {
                match &self.cfg.user {
                    Some(u) => Ok(u.clone()),
                    None => self.client.current_user().await,
                }
            })
            .await
            .cloned()
    }

    /// The id of the branch bases fork from: configured, or the project's default branch.
    pub async fn source_branch(&self) -> std::result::Result<String, ApiError> {
        self.source
            .get_or_try_init(|| async {
                if let Some(s) = &self.cfg.source_branch {
                    return Ok(s.clone());
                }
                let all = self.client.list_branches().await?;
                all.iter()
                    .find(|b| b.is_default())
                    .and_then(|b| b.id().map(str::to_string))
                    .ok_or_else(|| {
                        ApiConfigError::NoDefaultBranch {
                            project: self.cfg.project.clone(),
                        }
                        .into()
                    })
            })
            .await
            .cloned()
    }

    fn database_for(&self, branch: &str) -> String {
        self.cfg.database.replace("{branch}", branch)
    }

    fn sslmode_for(&self, host: &str) -> std::result::Result<SslMode, ApiError> {
        if !self.cfg.allow_plaintext_loopback {
            return Ok(SslMode::Require);
        }
        if is_loopback_host(host) {
            Ok(SslMode::Disable)
        } else {
            Err(ApiConfigError::PlaintextToRemoteEndpoint {
                host: host.to_string(),
            }
            .into())
        }
    }

    fn forget(&self, branch: &str) {
        if let Some(ep) = lock(&self.endpoints).remove(branch) {
            lock(&self.credentials).remove(&ep.resource);
        }
    }

    async fn endpoint_for(&self, branch: &str) -> std::result::Result<EndpointInfo, ApiError> {
        if let Some(ep) = lock(&self.endpoints).get(branch).cloned() {
            return Ok(ep);
        }
        let ep = self
            .client
            .ensure_read_write_endpoint(
                branch,
                &self.cfg.endpoint_id,
                self.cfg.endpoint_min_cu,
                self.cfg.endpoint_max_cu,
            )
            .await?;
        // No host is an empty one, which `check_host` refuses with the branch named.
        let host = ep.host().unwrap_or_default().trim().to_string();
        check_host(branch, &host)?;
        let resource = match ep.name.as_deref() {
            Some(n)
                if n.starts_with(&format!(
                    "{}/endpoints/",
                    self.client.branch_resource(branch)
                )) =>
            {
                n.to_string()
            }
            _ => self.client.endpoint_resource(branch, &self.cfg.endpoint_id),
        };
        let info = EndpointInfo { resource, host };
        lock(&self.endpoints).insert(branch.to_string(), info.clone());
        Ok(info)
    }

    /// The credential for `endpoint`: the cached one while it is more than
    /// `credential_refresh_margin` from the expiry the service reported, else (or when `fresh`)
    /// a newly minted one. The flag says whether it was minted by this call.
    async fn credential_for(
        &self,
        endpoint: &str,
        fresh: bool,
    ) -> std::result::Result<(CachedCredential, Minted), ApiError> {
        if !fresh
            && let Some(c) = lock(&self.credentials).get(endpoint).cloned()
            && SystemTime::now() + self.cfg.credential_refresh_margin < c.expires_at
        {
            return Ok((c, Minted::No));
        }
        let requested = self.cfg.credential_ttl;
        let cred = self.client.generate_credential(endpoint, requested).await?;
        let c = CachedCredential {
            token: cred.token,
            expires_at: credential_expiry(endpoint, cred.expire_time.as_deref(), requested),
        };
        tracing::debug!(endpoint, "minted a database credential");
        lock(&self.credentials).insert(endpoint.to_string(), c.clone());
        Ok((c, Minted::Yes))
    }

    async fn connect_info_for(
        &self,
        branch: &str,
        fresh: bool,
    ) -> std::result::Result<(ConnectInfo, Minted), ApiError> {
        validate_branch_id(branch)?;
        let ep = self.endpoint_for(branch).await?;
        let sslmode = self.sslmode_for(&ep.host)?;
        let user = self.user().await?;
        let (cred, minted) = self.credential_for(&ep.resource, fresh).await?;
        let info = ConnectInfo {
            host: ep.host,
            port: self.cfg.port,
            database: self.database_for(branch),
            user,
            secret: cred.token,
            expires_at: Some(cred.expires_at),
            sslmode,
            ca_file: self.cfg.ca_file.clone(),
        };
        Ok((info, minted))
    }

    /// The connection details handed to callers ([`BranchProvider::connect_info`]). A cached
    /// credential is checked with a login first: a service may end a credential before the
    /// expiry it reported (expired or revoked mid-use), which only a login shows. When the
    /// server refuses it (SQLSTATE 28P01) a new one is minted, once. A login that fails for
    /// another reason (the network, the compute) says nothing about the credential, which is
    /// then handed out as it is: the caller's own connection meets and reports that failure.
    async fn checked_connect_info(
        &self,
        branch: &str,
    ) -> std::result::Result<ConnectInfo, ApiError> {
        let (info, minted) = self.connect_info_for(branch, false).await?;
        if minted == Minted::Yes {
            return Ok(info);
        }
        match connect_raw(&info).await {
            Ok(client) => {
                drop(client);
                Ok(info)
            }
            Err(ConnectFailure::Postgres(e)) if is_refused_password(&e) => {
                tracing::info!(
                    branch,
                    "the server refused the cached credential (expired or revoked before its reported expiry); minting a new one"
                );
                Ok(self.connect_info_for(branch, true).await?.0)
            }
            Err(ConnectFailure::Postgres(e)) => {
                tracing::debug!(
                    branch,
                    "checking the cached credential with a login failed for another reason; handing it out: {e}"
                );
                Ok(info)
            }
            Err(ConnectFailure::Refused(e)) => Err(e),
        }
    }

    /// Logs in to a branch and runs `SELECT 1`, retrying the login window after creation
    /// with a fresh credential each attempt; returns the open client.
    async fn wait_for_login(
        &self,
        branch: &str,
    ) -> std::result::Result<tokio_postgres::Client, ApiError> {
        let policy = self.cfg.auth_ready;
        let started = Instant::now();
        let mut backoff = policy.initial_backoff;
        let mut fresh = false;
        loop {
            let (info, _) = self.connect_info_for(branch, fresh).await?;
            let failure = match connect_raw(&info).await {
                Ok(client) => {
                    return match client.simple_query("SELECT 1").await {
                        Ok(_) => Ok(client),
                        Err(e) => Err(ApiError::postgres(format!("probing branch {branch}"), &e)),
                    };
                }
                Err(ConnectFailure::Refused(e)) => return Err(e),
                Err(ConnectFailure::Postgres(e)) => e,
            };
            let said = ApiError::postgres(format!("connecting to branch {branch}"), &failure);
            if !fresh && is_refused_password(&failure) {
                // A cached credential the server no longer takes (revoked): mint a new one
                // and try again at once.
                tracing::info!(
                    branch,
                    "the cached credential was refused; minting a new one"
                );
                fresh = true;
                continue;
            }
            if !is_login_window_error(&failure) {
                return Err(match is_tls_error(&failure) {
                    true => ApiError::Tls {
                        host: info.host.clone(),
                        message: consort_actors::error_chain(&failure),
                    },
                    false => said,
                });
            }
            let waited = started.elapsed();
            if waited + backoff > policy.budget {
                return Err(ApiError::AuthNotReady {
                    branch: branch.to_string(),
                    waited,
                    last_error: said.to_string(),
                });
            }
            tracing::info!(
                branch,
                wait_ms = backoff.as_millis() as u64,
                "branch not accepting logins yet: {said}"
            );
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(policy.max_backoff);
            fresh = true;
        }
    }

    async fn wait_branch_ready(&self, id: &str) -> std::result::Result<BranchResource, ApiError> {
        let started = Instant::now();
        let mut interval = self.cfg.poll.initial_interval;
        loop {
            let b = self.client.get_branch(id).await?;
            match b.state() {
                Some("INIT" | "IMPORTING" | "RESETTING") => {}
                Some("DELETED") => {
                    return Err(ApiError::NotFound {
                        code: "DELETED".into(),
                        message: format!("branch {id} is deleted"),
                    });
                }
                _ => return Ok(b),
            }
            let waited = started.elapsed();
            if waited >= self.cfg.poll.timeout {
                return Err(ApiError::OperationTimeout {
                    operation: format!("branch {id} ready"),
                    waited,
                });
            }
            tokio::time::sleep(interval).await;
            interval = self.cfg.poll.next_interval(interval);
        }
    }

    /// Creates (or reuses, when the lineage matches) branch `id` from `source` and waits for
    /// it to be ready. `no_expiry` for bases, the configured TTL otherwise.
    async fn create_branch(
        &self,
        id: &str,
        source: &str,
        no_expiry: bool,
    ) -> std::result::Result<BranchResource, ApiError> {
        let source_resource = self.client.branch_resource(source);
        let spec = BranchSpec {
            source_branch: Some(source_resource.clone()),
            ttl: (!no_expiry).then(|| duration_wire(self.cfg.branch_ttl)),
            no_expiry: no_expiry.then_some(true),
            ..BranchSpec::default()
        };
        self.forget(id);
        tracing::info!(branch = id, source, "creating Lakebase branch");
        let op = match self.client.create_branch(id, &spec).await {
            Ok(op) => op,
            Err(e) if e.is_already_exists() => {
                return self.reuse_branch(id, source, source_resource).await;
            }
            Err(ApiError::InvalidRequest { code, message }) => {
                return Err(self.spec_refusal(id, no_expiry, code, message));
            }
            Err(e) => return Err(e),
        };
        // From here the branch exists: whatever fails deletes it before the error returns.
        match self.client.finish_create(id, op).await {
            Ok(b) => Ok(b),
            Err(e) => Err(self.discard(id, e).await),
        }
    }

    /// A branch of this name exists already: reused when it was forked from `source`.
    async fn reuse_branch(
        &self,
        id: &str,
        source: &str,
        source_resource: String,
    ) -> std::result::Result<BranchResource, ApiError> {
        let existing = self.wait_branch_ready(id).await?;
        let actual = existing.source().map(str::to_string);
        if actual.as_deref().map(last_segment) != Some(source) {
            return Err(ApiError::Conflict {
                name: id.to_string(),
                expected: source_resource,
                actual,
            });
        }
        tracing::info!(
            branch = id,
            "reusing an existing branch with the same source"
        );
        Ok(existing)
    }

    /// A 400 answer to a create, typed by what the service says: the expiry (a TTL over the
    /// workspace's maximum), the name, or the rest of the spec.
    fn spec_refusal(&self, id: &str, no_expiry: bool, code: String, message: String) -> ApiError {
        let said = message.to_ascii_lowercase();
        if !no_expiry && (said.contains("expiration") || said.contains("ttl")) {
            return ApiError::TtlRefused {
                ttl: self.cfg.branch_ttl,
                code,
                message,
            };
        }
        if said.contains("branch_id") || said.contains("branch id") || said.contains("name") {
            return ApiError::InvalidName {
                name: id.to_string(),
                reason: format!("refused by the service ({code}): {message}"),
            };
        }
        ApiError::SpecRefused {
            name: id.to_string(),
            code,
            message,
        }
    }

    /// Deletes branch `id` after `cause` stopped its creation (or filling), so that nothing
    /// leaks until its TTL; returns the cause. A failing delete is logged, not returned.
    async fn discard<E: fmt::Display>(&self, id: &str, cause: E) -> E {
        self.forget(id);
        lock(&self.bases).remove(id);
        match self.client.delete_branch(id).await {
            Ok(_) => tracing::info!(
                branch = id,
                "deleted the branch whose creation failed: {cause}"
            ),
            Err(e) => tracing::warn!(
                branch = id,
                "could not delete the branch whose creation failed ({cause}): {e}; the service's expiry removes it"
            ),
        }
        cause
    }

    /// The base of a branch with source `source`; a branch without a source (the project's
    /// root) has the empty base id, keyed by the empty name.
    fn base_ref_for(&self, source: Option<&str>) -> BaseRef {
        let id = source.map(last_segment).unwrap_or_default().to_string();
        if let Some(key) = lock(&self.bases).get(&id) {
            return BaseRef { id, key: *key };
        }
        if self.source.get().is_some_and(|s| *s == id) {
            return BaseRef {
                id,
                key: BaseSpec::default().key(),
            };
        }
        // A base this process did not prepare: keyed by the source's resource name.
        let key = ContentHash::of_bytes(source.unwrap_or_default().as_bytes());
        BaseRef { id, key }
    }

    async fn base_is_complete(
        &self,
        id: &str,
        key: &ContentHash,
    ) -> std::result::Result<bool, ApiError> {
        let client = self.wait_for_login(id).await?;
        let pg = |e: tokio_postgres::Error| ApiError::postgres(format!("checking base {id}"), &e);
        let has_table = client
            .query_one("SELECT to_regclass('consort_base') IS NOT NULL", &[])
            .await
            .map_err(pg)?
            .get::<_, bool>(0);
        if !has_table {
            return Ok(false);
        }
        let row = client
            .query_opt(
                "SELECT 1 FROM consort_base WHERE key = $1",
                &[&key.to_hex()],
            )
            .await
            .map_err(pg)?;
        Ok(row.is_some())
    }

    async fn prepare_base_impl(&self, spec: &BaseSpec) -> Result<BaseRef> {
        let key = spec.key();
        let source = self.source_branch().await?;
        if spec.migrations.is_empty() && spec.fixtures.is_empty() {
            return Ok(BaseRef { id: source, key });
        }
        migrate::check_plan(&spec.migrations)?;
        let _serial = self.base_lock.lock().await;
        let id = format!("{}-base-{}", self.cfg.prefix, key.short());
        validate_owned(&id, &self.cfg.prefix)?;
        if lock(&self.bases).get(&id) == Some(&key) {
            return Ok(BaseRef { id, key });
        }
        match self.client.get_branch(&id).await {
            Ok(_) => {
                let existing = self.wait_branch_ready(&id).await?;
                if existing.source().map(last_segment) == Some(source.as_str())
                    && self.base_is_complete(&id, &key).await?
                {
                    tracing::info!(base = %id, "reusing a complete base branch");
                    lock(&self.bases).insert(id.clone(), key);
                    return Ok(BaseRef { id, key });
                }
                tracing::warn!(base = %id, "base branch is incomplete or has another source; rebuilding");
                self.forget(&id);
                self.client.delete_branch(&id).await?;
            }
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        self.create_branch(&id, &source, true).await?;
        if let Err(e) = self.fill_base(&id, spec, &key).await {
            return Err(self.discard(&id, e).await);
        }
        lock(&self.bases).insert(id.clone(), key);
        tracing::info!(base = %id, "base branch ready");
        Ok(BaseRef { id, key })
    }

    /// Builds a new base branch from `spec` and marks it complete.
    async fn fill_base(&self, id: &str, spec: &BaseSpec, key: &ContentHash) -> Result<()> {
        let mut client = self.wait_for_login(id).await?;
        self.builder.build(&mut client, spec).await?;
        let mark = |e: tokio_postgres::Error| ApiError::postgres(format!("marking base {id}"), &e);
        client
            .batch_execute(
                "CREATE TABLE IF NOT EXISTS consort_base (\
                   key text PRIMARY KEY, built_at timestamptz NOT NULL DEFAULT now())",
            )
            .await
            .map_err(mark)?;
        client
            .execute(
                "INSERT INTO consort_base (key) VALUES ($1) ON CONFLICT DO NOTHING",
                &[&key.to_hex()],
            )
            .await
            .map_err(mark)?;
        Ok(())
    }

    async fn promote_impl(
        &self,
        migrations: &[consort_actors::Migration],
    ) -> Result<PromoteOutcome> {
        migrate::check_plan(migrations)?;
        let source = self.source_branch().await?;
        let mut client = self.wait_for_login(&source).await?;
        let (report, outcome) = migrate::apply_partial(&mut client, migrations, None).await;
        let failure = match outcome {
            Ok(()) => None,
            Err(e @ (Error::Migration { .. } | Error::ChecksumMismatch { .. })) => {
                tracing::warn!(parent = %source, error = %e, "promote stopped");
                Some(e.to_string())
            }
            Err(e) => return Err(e),
        };
        let verified = failure.is_none() && migrate::verify(&client, migrations).await?;
        tracing::info!(parent = %source, applied = report.applied.len(), verified, "promoted migrations");
        Ok(PromoteOutcome {
            target: self.client.branch_resource(&source),
            applied: report.applied,
            already_applied: report.already_applied,
            verified,
            failure,
        })
    }

    async fn keep_impl(
        &self,
        branch: &Branch,
        until: SystemTime,
    ) -> std::result::Result<(), ApiError> {
        validate_owned(&branch.name, &self.cfg.prefix)?;
        self.client
            .set_branch_expire_time(&branch.name, &format_rfc3339(until))
            .await?;
        tracing::info!(branch = %branch.name, until = %format_rfc3339(until), "kept for inspection");
        Ok(())
    }

    async fn create_impl(
        &self,
        name: &str,
        from: &BaseRef,
    ) -> std::result::Result<Branch, ApiError> {
        validate_owned(name, &self.cfg.prefix)?;
        validate_branch_id(&from.id)?;
        let res = self.create_branch(name, &from.id, false).await?;
        // The branch exists: a failure to log in (TLS, the login window, …) deletes it.
        match self.wait_for_login(name).await {
            Ok(client) => drop(client),
            Err(e) => return Err(self.discard(name, e).await),
        }
        Ok(Branch {
            name: name.to_string(),
            id: res
                .name
                .clone()
                .unwrap_or_else(|| self.client.branch_resource(name)),
            base: from.clone(),
            created_at: res
                .create_time
                .as_deref()
                .and_then(parse_rfc3339)
                .unwrap_or_else(SystemTime::now),
        })
    }

    async fn delete_impl(&self, name: &str) -> std::result::Result<(), ApiError> {
        validate_owned(name, &self.cfg.prefix)?;
        self.forget(name);
        let existed = self.client.delete_branch(name).await?;
        tracing::info!(branch = name, existed, "deleted Lakebase branch");
        lock(&self.bases).remove(name);
        Ok(())
    }

    fn is_live(b: &BranchResource) -> bool {
        b.state() != Some("DELETED")
            && b.status
                .as_ref()
                .and_then(|s| s.delete_time.as_deref())
                .is_none()
    }

    async fn list_impl(&self, prefix: &str) -> std::result::Result<Vec<Branch>, ApiError> {
        let all = self.client.list_branches().await?;
        Ok(all
            .iter()
            .filter(|b| Self::is_live(b))
            .filter_map(|b| {
                let id = b.id()?;
                // `id()` is the last segment of `name`, so `name` is present here.
                let resource = b.name.clone()?;
                id.starts_with(prefix).then(|| Branch {
                    name: id.to_string(),
                    id: resource,
                    base: self.base_ref_for(b.source()),
                    created_at: b
                        .create_time
                        .as_deref()
                        .and_then(parse_rfc3339)
                        // The service always sends it. Shown as the epoch when it did not;
                        // sweeps read the time themselves and never sweep an unknown age.
                        .unwrap_or(SystemTime::UNIX_EPOCH),
                })
            })
            .collect())
    }

    /// When a branch expires: its reported expiry, else its spec's expiry or creation + TTL;
    /// `None` for `no_expiry` branches.
    fn expiry_of(b: &BranchResource) -> Option<SystemTime> {
        let status = b.status.as_ref().and_then(|s| s.expire_time.as_deref());
        let spec = b.spec.as_ref();
        if let Some(t) = status.or_else(|| spec.and_then(|s| s.expire_time.as_deref())) {
            return parse_rfc3339(t);
        }
        let ttl = spec
            .and_then(|s| s.ttl.as_deref())
            .and_then(|t| t.strip_suffix('s'))
            .and_then(|n| n.parse::<f64>().ok())
            .filter(|n| n.is_finite() && *n >= 0.0)?;
        Self::created_of(b)?.checked_add(Duration::from_secs_f64(ttl.min(1e9)))
    }

    fn created_of(b: &BranchResource) -> Option<SystemTime> {
        b.create_time.as_deref().and_then(parse_rfc3339)
    }

    async fn sweep_impl(&self, older_than: Duration) -> std::result::Result<usize, ApiError> {
        // An age reaching back before 1970 is "older than anything": the cutoff saturates.
        let cutoff = SystemTime::now()
            .checked_sub(older_than)
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.sweep_where(|b| Self::created_of(b).is_some_and(|t| t < cutoff))
            .await
    }

    async fn sweep_orphans_impl(&self) -> std::result::Result<usize, ApiError> {
        let now = SystemTime::now();
        // (Saturates at the epoch on a clock set before 1970.)
        let day_ago = now
            .checked_sub(Duration::from_secs(24 * 3600))
            .unwrap_or(SystemTime::UNIX_EPOCH);
        self.sweep_where(|b| match Self::expiry_of(b) {
            Some(t) => t <= now,
            None => Self::created_of(b).is_some_and(|t| t < day_ago),
        })
        .await
    }

    /// Deletes live `<prefix>-…` branches (never the default branch) for which `doomed`
    /// holds: ordinary branches first, then bases that no remaining branch forks from and
    /// that this process did not prepare. Tries them all; returns the first error, if any.
    async fn sweep_where(
        &self,
        doomed: impl Fn(&BranchResource) -> bool,
    ) -> std::result::Result<usize, ApiError> {
        let all = self.client.list_branches().await?;
        let prefix = &self.cfg.prefix;
        let base_prefix = format!("{prefix}-base-");
        let live: Vec<&BranchResource> = all.iter().filter(|b| Self::is_live(b)).collect();
        let candidate = |b: &BranchResource| {
            b.id().is_some_and(|id| has_owner_prefix(id, prefix)) && !b.is_default() && doomed(b)
        };
        let mut deleted: HashSet<String> = HashSet::new();
        let mut first_error: Option<ApiError> = None;
        // Children first.
        for b in live.iter().filter(|b| candidate(b)) {
            let Some(id) = b.id() else { continue };
            if id.starts_with(&base_prefix) {
                continue;
            }
            self.sweep_delete(id, "branch", &mut deleted, &mut first_error)
                .await;
        }
        // Then bases nobody forks from any more and this process is not using.
        let in_use: HashSet<&str> = live
            .iter()
            .filter(|b| b.id().is_some_and(|id| !deleted.contains(id)))
            .filter_map(|b| b.source().map(last_segment))
            .collect();
        let ours: HashSet<String> = lock(&self.bases).keys().cloned().collect();
        for b in live.iter().filter(|b| candidate(b)) {
            let Some(id) = b.id() else { continue };
            if !id.starts_with(&base_prefix) || in_use.contains(id) || ours.contains(id) {
                continue;
            }
            self.sweep_delete(id, "base", &mut deleted, &mut first_error)
                .await;
        }
        tracing::info!(deleted = deleted.len(), "swept Lakebase branches");
        match first_error {
            Some(e) => Err(e),
            None => Ok(deleted.len()),
        }
    }

    /// Deletes `id` (a `what`, branch or base) for a sweep: adds it to `deleted`, or logs the
    /// error and keeps it when it is the sweep's first.
    async fn sweep_delete(
        &self,
        id: &str,
        what: &str,
        deleted: &mut HashSet<String>,
        first_error: &mut Option<ApiError>,
    ) {
        match self.delete_impl(id).await {
            Ok(()) => {
                deleted.insert(id.to_string());
            }
            Err(e) => {
                tracing::warn!(
                    branch = id,
                    "sweep could not delete {what}: {}",
                    consort_actors::error_chain(&e)
                );
                first_error.get_or_insert(e);
            }
        }
    }
}

impl BranchProvider for LakebaseProvider {
    fn kind(&self) -> &'static str {
        "lakebase"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            point_in_time: true,
            native_reset: false,
            server_ttl: true,
            max_live_branches: Some(self.cfg.max_live_branches),
            typical_create_ms: 10_000,
        }
    }

    fn prepare_base<'a>(&'a self, spec: &'a BaseSpec) -> BoxFuture<'a, Result<BaseRef>> {
        Box::pin(self.prepare_base_impl(spec))
    }

    fn create<'a>(&'a self, name: &'a str, from: &'a BaseRef) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(async move { Ok(self.create_impl(name, from).await?) })
    }

    fn connect_info<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<ConnectInfo>> {
        Box::pin(async move { Ok(self.checked_connect_info(&branch.name).await?) })
    }

    fn invalidate_credential(&self, branch: &Branch) {
        if let Some(ep) = lock(&self.endpoints).get(&branch.name) {
            lock(&self.credentials).remove(&ep.resource);
            tracing::info!(branch = %branch.name, "forgot the refused credential");
        }
    }

    fn reset<'a>(&'a self, branch: &'a Branch) -> BoxFuture<'a, Result<Branch>> {
        Box::pin(async move {
            self.delete_impl(&branch.name).await?;
            Ok(self.create_impl(&branch.name, &branch.base).await?)
        })
    }

    fn delete<'a>(&'a self, name: &'a str) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Ok(self.delete_impl(name).await?) })
    }

    fn list<'a>(&'a self, prefix: &'a str) -> BoxFuture<'a, Result<Vec<Branch>>> {
        Box::pin(async move { Ok(self.list_impl(prefix).await?) })
    }

    fn sweep(&self, older_than: Duration) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move { Ok(self.sweep_impl(older_than).await?) })
    }

    fn sweep_orphans(&self) -> BoxFuture<'_, Result<usize>> {
        Box::pin(async move { Ok(self.sweep_orphans_impl().await?) })
    }

    fn keep_for_inspection<'a>(
        &'a self,
        branch: &'a Branch,
        until: SystemTime,
    ) -> BoxFuture<'a, Result<()>> {
        Box::pin(async move { Ok(self.keep_impl(branch, until).await?) })
    }

    fn promote<'a>(
        &'a self,
        migrations: &'a [consort_actors::Migration],
    ) -> BoxFuture<'a, Result<PromoteOutcome>> {
        Box::pin(self.promote_impl(migrations))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_expires_when_the_service_says_but_never_after_the_lifetime_asked_for() {
        let hour = Duration::from_secs(3600);
        let soon = SystemTime::now() + Duration::from_secs(600);
        let at = credential_expiry("e", Some(&format_rfc3339(soon)), hour);
        let off = |a: SystemTime, b: SystemTime| {
            a.duration_since(b)
                .or_else(|_| b.duration_since(a))
                .expect("a difference")
        };
        assert!(
            off(at, soon) < Duration::from_millis(2),
            "the service's expiry"
        );
        let late = SystemTime::now() + 5 * hour;
        let capped = credential_expiry("e", Some(&format_rfc3339(late)), hour);
        assert!(
            capped <= SystemTime::now() + hour,
            "capped at the lifetime asked for"
        );
        for reported in [None, Some("tomorrow")] {
            let assumed = credential_expiry("e", reported, hour);
            assert!(off(assumed, SystemTime::now() + hour) < Duration::from_secs(5));
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| map.get(k).cloned()
    }

    #[test]
    fn config_from_the_environment() {
        let cfg = LakebaseConfig::from_lookup(env(&[
            (ENV_HOST, "adb-1.azuredatabricks.net"),
            (ENV_TOKEN, " dapi-secret-123 "),
            (ENV_PROJECT, "my-app"),
            (ENV_SOURCE_BRANCH, "staging"),
            (ENV_DATABASE, ""),
        ]))
        .expect("config");
        assert_eq!(cfg.token.expose(), "dapi-secret-123");
        assert_eq!(cfg.source_branch.as_deref(), Some("staging"));
        assert_eq!(cfg.database, "databricks_postgres");
        assert_eq!(cfg.user, None);
        assert!(!format!("{cfg:?}").contains("dapi-secret"));
        let p = LakebaseProvider::new(cfg).expect("provider");
        assert!(!format!("{p:?}").contains("dapi-secret"));
        assert_eq!(
            p.client().rest().base().as_str(),
            "https://adb-1.azuredatabricks.net/"
        );

        let missing = LakebaseConfig::from_lookup(env(&[
            (ENV_HOST, "adb-1.azuredatabricks.net"),
            (ENV_PROJECT, "my-app"),
        ]));
        assert!(
            matches!(&missing, Err(e @ ApiError::Config(_)) if e.to_string().contains(ENV_TOKEN)),
            "{missing:?}"
        );
    }

    #[test]
    fn config_is_checked() {
        let base = LakebaseConfig::new("https://x.com", Secret::new("dapi-1"), "p");
        let mut bad = base.clone();
        bad.project = "My_Project".into();
        assert!(LakebaseProvider::new(bad).is_err());
        let mut bad = base.clone();
        bad.source_branch = Some("Bad Name".into());
        assert!(LakebaseProvider::new(bad).is_err());
        let mut bad = base.clone();
        bad.host = "http://x.com".into();
        assert!(LakebaseProvider::new(bad).is_err());
        let mut bad = base.clone();
        bad.token = Secret::new("  ");
        assert!(LakebaseProvider::new(bad).is_err());
        assert!(LakebaseProvider::new(base).is_ok());
    }

    #[test]
    fn endpoint_hosts_are_plain_names() {
        assert!(check_host("b", "ep-x-1.database.us-east-1.cloud.databricks.com").is_ok());
        assert!(check_host("b", "127.0.0.1").is_ok());
        assert!(check_host("b", "/var/run/postgresql").is_err());
        assert!(check_host("b", "a b").is_err());
        assert!(check_host("b", "").is_err());
        assert!(check_host("b", "-oProxyCommand").is_err());
    }
}
