//! The Lakebase Autoscaling control-plane calls (`/api/2.0/postgres/…`): branches,
//! long-running operations, endpoints and database credentials.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use reqwest::{Method, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use super::error::{ApiConfigError, ApiError};
use super::http::{RestClient, classify_code, decode};
use super::naming::{duration_wire, validate_branch_id, validate_segment};
use super::retry::PollPolicy;
use super::types::{
    BranchResource, BranchSpec, CredentialRequest, CredentialResponse, ENDPOINT_TYPE_READ_WRITE,
    EndpointResource, EndpointSpec, ListBranchesResponse, ListEndpointsResponse, Me, Operation,
};

/// The API prefix of Lakebase Autoscaling.
const API: [&str; 3] = ["api", "2.0", "postgres"];
/// The most pages a listing follows (a server that never ends its pages is an error).
const MAX_PAGES: usize = 1000;

/// A typed client for one Lakebase project.
#[derive(Debug, Clone)]
pub struct LakebaseClient {
    rest: RestClient,
    project: String,
    poll: PollPolicy,
}

impl LakebaseClient {
    /// A client for `project` over `rest`; operations are polled per `poll`.
    pub fn new(rest: RestClient, project: &str, poll: PollPolicy) -> Result<Self, ApiError> {
        validate_segment("project", project)?;
        Ok(LakebaseClient {
            rest,
            project: project.to_string(),
            poll,
        })
    }

    /// The project id.
    pub fn project(&self) -> &str {
        &self.project
    }

    /// The HTTP layer (for scrubbing and the base URL).
    pub fn rest(&self) -> &RestClient {
        &self.rest
    }

    /// `projects/{p}/branches/{b}`.
    pub fn branch_resource(&self, branch: &str) -> String {
        format!("projects/{}/branches/{branch}", self.project)
    }

    /// `projects/{p}/branches/{b}/endpoints/{e}`.
    pub fn endpoint_resource(&self, branch: &str, endpoint: &str) -> String {
        format!(
            "projects/{}/branches/{branch}/endpoints/{endpoint}",
            self.project
        )
    }

    fn url(&self, tail: &[&str]) -> Result<Url, ApiError> {
        let mut segs: Vec<&str> = API.to_vec();
        segs.extend(["projects", self.project.as_str()]);
        segs.extend(tail);
        self.rest.url(&segs)
    }

    /// `POST …/branches?branch_id=` — starts creating a branch; returns the operation.
    pub async fn create_branch(&self, id: &str, spec: &BranchSpec) -> Result<Operation, ApiError> {
        validate_branch_id(id)?;
        self.post_create(&["branches"], ("branch_id", id), spec, "create branch")
            .await
    }

    /// `POST` to the collection at `segs` with the new resource's id as the query pair `id`
    /// and `{"spec": spec}` as the body; returns the operation.
    async fn post_create(
        &self,
        segs: &[&str],
        (key, id): (&str, &str),
        spec: &impl Serialize,
        what: &str,
    ) -> Result<Operation, ApiError> {
        let mut url = self.url(segs)?;
        url.query_pairs_mut().append_pair(key, id);
        let body = json!({ "spec": spec });
        self.rest.call(Method::POST, url, Some(&body), what).await
    }

    /// Creates a branch and waits for its operation; returns the branch.
    pub async fn create_branch_and_wait(
        &self,
        id: &str,
        spec: &BranchSpec,
    ) -> Result<BranchResource, ApiError> {
        let op = self.create_branch(id, spec).await?;
        self.finish_create(id, op).await
    }

    /// Waits for a create operation of branch `id` and reads the branch it made.
    pub async fn finish_create(&self, id: &str, op: Operation) -> Result<BranchResource, ApiError> {
        let response = self.wait(op).await?;
        match response {
            Some(v) if v.get("name").is_some() => decode("create branch", v.to_string().as_bytes()),
            // Some services leave `response` empty; read the branch itself.
            _ => self.get_branch(id).await,
        }
    }

    /// `GET …/branches/{b}`.
    pub async fn get_branch(&self, id: &str) -> Result<BranchResource, ApiError> {
        validate_branch_id(id)?;
        let url = self.url(&["branches", id])?;
        self.rest.call(Method::GET, url, None, "get branch").await
    }

    /// `GET …/branches`, following `next_page_token` to the end.
    pub async fn list_branches(&self) -> Result<Vec<BranchResource>, ApiError> {
        self.all_pages(&["branches"], "list branches", |p: ListBranchesResponse| {
            (p.branches, p.next_page_token)
        })
        .await
    }

    /// `GET` of the collection at `segs`, following `next_page_token` to the end: at most
    /// [`MAX_PAGES`] pages, never the same token twice. `split` parts a page into its items and
    /// the next token.
    async fn all_pages<P: DeserializeOwned, T>(
        &self,
        segs: &[&str],
        what: &str,
        split: fn(P) -> (Vec<T>, Option<String>),
    ) -> Result<Vec<T>, ApiError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        let mut seen = HashSet::new();
        for _ in 0..MAX_PAGES {
            let mut url = self.url(segs)?;
            if let Some(t) = &token {
                url.query_pairs_mut().append_pair("page_token", t);
            }
            let (items, next) = split(self.rest.call(Method::GET, url, None, what).await?);
            out.extend(items);
            match next.filter(|t| !t.is_empty()) {
                None => return Ok(out),
                Some(t) if seen.insert(t.clone()) => token = Some(t),
                Some(_) => {
                    return Err(ApiError::Decode {
                        what: what.into(),
                        message: "the server repeated a page token".into(),
                    });
                }
            }
        }
        Err(ApiError::Decode {
            what: what.into(),
            message: format!("more than {MAX_PAGES} pages"),
        })
    }

    /// `PATCH …/branches/{b}?update_mask=spec.expiration` with `{"spec": {"expire_time"}}`:
    /// moves the branch's server-side expiry (RFC 3339) and waits for the operation.
    pub async fn set_branch_expire_time(
        &self,
        id: &str,
        expire_time: &str,
    ) -> Result<(), ApiError> {
        validate_branch_id(id)?;
        let mut url = self.url(&["branches", id])?;
        url.query_pairs_mut()
            .append_pair("update_mask", "spec.expiration");
        let body = json!({ "spec": { "expire_time": expire_time } });
        let op: Operation = self
            .rest
            .call(Method::PATCH, url, Some(&body), "update branch")
            .await?;
        self.wait(op).await.map(|_| ())
    }

    /// `DELETE …/branches/{b}?purge=true&allow_missing=true` and waits for it. Returns `false`
    /// when the service says the branch did not exist (a 404: not an error either).
    pub async fn delete_branch(&self, id: &str) -> Result<bool, ApiError> {
        validate_branch_id(id)?;
        let mut url = self.url(&["branches", id])?;
        url.query_pairs_mut()
            .append_pair("purge", "true")
            .append_pair("allow_missing", "true");
        let op: Operation = match self
            .rest
            .call(Method::DELETE, url, None, "delete branch")
            .await
        {
            Ok(op) => op,
            Err(e) if e.is_not_found() => return Ok(false),
            Err(e) => return Err(e),
        };
        match self.wait(op).await {
            Ok(_) => Ok(true),
            Err(e) if e.is_not_found() => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Polls an operation until it is done; returns its `response` (if any), or the typed
    /// error it finished with.
    pub async fn wait(&self, mut op: Operation) -> Result<Option<Value>, ApiError> {
        let started = Instant::now();
        let mut interval = self.poll.initial_interval;
        loop {
            if op.done == Some(true) {
                // The operation's name is only for the message; an unnamed one reads as "".
                let name = op.name.clone().unwrap_or_default();
                if let Some(err) = op.error {
                    let code = err.code_text();
                    let message = self.rest.scrub(err.message.as_deref().unwrap_or(""));
                    tracing::debug!(operation = %name, %code, "operation failed");
                    return Err(classify_code(&code, &message).unwrap_or(
                        ApiError::OperationFailed {
                            operation: name,
                            code,
                            message,
                        },
                    ));
                }
                return Ok(op.response);
            }
            let name = op.name.clone().ok_or_else(|| ApiError::Decode {
                what: "operation".into(),
                message: "an unfinished operation has no name to poll".into(),
            })?;
            let waited = started.elapsed();
            if waited >= self.poll.timeout {
                return Err(ApiError::OperationTimeout {
                    operation: name,
                    waited,
                });
            }
            tokio::time::sleep(interval.min(self.poll.timeout.saturating_sub(waited))).await;
            interval = self.poll.next_interval(interval);
            let url = self.operation_url(&name)?;
            op = self
                .rest
                .call(Method::GET, url, None, "poll operation")
                .await?;
            if op.name.is_none() {
                op.name = Some(name);
            }
        }
    }

    /// `GET /api/2.0/postgres/{name}`; the name comes from the server, so each segment is
    /// checked before it becomes part of a URL.
    fn operation_url(&self, name: &str) -> Result<Url, ApiError> {
        let segs: Vec<&str> = name.split('/').collect();
        let ok = segs.len() >= 2
            && segs.iter().all(|s| {
                !s.is_empty()
                    && *s != "."
                    && *s != ".."
                    && s.len() <= 200
                    && s.chars()
                        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'))
            });
        if !ok {
            return Err(ApiError::Decode {
                what: "operation".into(),
                message: format!(
                    "operation name `{}` is not a resource path",
                    name.chars().take(120).collect::<String>()
                ),
            });
        }
        let mut all: Vec<&str> = API.to_vec();
        all.extend(segs);
        self.rest.url(&all)
    }

    /// `GET …/branches/{b}/endpoints`, all pages.
    pub async fn list_endpoints(&self, branch: &str) -> Result<Vec<EndpointResource>, ApiError> {
        validate_branch_id(branch)?;
        let segs = ["branches", branch, "endpoints"];
        self.all_pages(&segs, "list endpoints", |p: ListEndpointsResponse| {
            (p.endpoints, p.next_page_token)
        })
        .await
    }

    /// `GET …/branches/{b}/endpoints/{e}`.
    pub async fn get_endpoint(
        &self,
        branch: &str,
        endpoint: &str,
    ) -> Result<EndpointResource, ApiError> {
        validate_branch_id(branch)?;
        validate_segment("endpoint", endpoint)?;
        let url = self.url(&["branches", branch, "endpoints", endpoint])?;
        self.rest.call(Method::GET, url, None, "get endpoint").await
    }

    /// `POST …/branches/{b}/endpoints?endpoint_id=` — starts creating an endpoint.
    pub async fn create_endpoint(
        &self,
        branch: &str,
        endpoint: &str,
        spec: &EndpointSpec,
    ) -> Result<Operation, ApiError> {
        validate_branch_id(branch)?;
        validate_segment("endpoint", endpoint)?;
        let segs = ["branches", branch, "endpoints"];
        self.post_create(&segs, ("endpoint_id", endpoint), spec, "create endpoint")
            .await
    }

    /// Makes sure the branch has a read-write endpoint with a host: reuses one if listed,
    /// else creates `endpoint_id` (`ENDPOINT_TYPE_READ_WRITE`, `min_cu`–`max_cu`) and waits;
    /// then polls until a host is assigned.
    pub async fn ensure_read_write_endpoint(
        &self,
        branch: &str,
        endpoint_id: &str,
        min_cu: f64,
        max_cu: f64,
    ) -> Result<EndpointResource, ApiError> {
        let existing = self
            .list_endpoints(branch)
            .await?
            .into_iter()
            .find(EndpointResource::is_read_write);
        let endpoint = match existing {
            Some(e) => e,
            None => {
                let spec = EndpointSpec {
                    endpoint_type: Some(ENDPOINT_TYPE_READ_WRITE.to_string()),
                    autoscaling_limit_min_cu: Some(min_cu),
                    autoscaling_limit_max_cu: Some(max_cu),
                };
                tracing::info!(
                    branch,
                    endpoint = endpoint_id,
                    "creating read-write endpoint"
                );
                let created = match self.create_endpoint(branch, endpoint_id, &spec).await {
                    Ok(op) => self.wait(op).await.map(Some),
                    Err(e) if e.is_already_exists() => Ok(None),
                    Err(e) => Err(e),
                };
                match created {
                    Ok(Some(Some(v))) if v.get("name").is_some() => {
                        decode("create endpoint", v.to_string().as_bytes())?
                    }
                    Ok(_) => self.get_endpoint(branch, endpoint_id).await?,
                    Err(e) if e.is_already_exists() => {
                        self.get_endpoint(branch, endpoint_id).await?
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        if endpoint.host().is_some() {
            return Ok(endpoint);
        }
        let id = endpoint
            .name
            .as_deref()
            .map(super::naming::last_segment)
            // The service echoes the id it was asked for; without a name, that id it is.
            .unwrap_or(endpoint_id)
            .to_string();
        let started = Instant::now();
        let mut interval = self.poll.initial_interval;
        loop {
            let waited = started.elapsed();
            if waited >= self.poll.timeout {
                return Err(ApiError::Endpoint {
                    branch: branch.to_string(),
                    message: format!(
                        "no host assigned after {}",
                        crate::error::duration_text(waited)
                    ),
                });
            }
            tokio::time::sleep(interval).await;
            interval = self.poll.next_interval(interval);
            let e = self.get_endpoint(branch, &id).await?;
            if e.host().is_some() {
                return Ok(e);
            }
        }
    }

    /// `POST /api/2.0/postgres/credentials` — a database token for an endpoint
    /// (`projects/p/branches/b/endpoints/e`), valid for `ttl` (the service allows 300–3600 s;
    /// the value is clamped to that range).
    pub async fn generate_credential(
        &self,
        endpoint_resource: &str,
        ttl: Duration,
    ) -> Result<CredentialResponse, ApiError> {
        let ttl = ttl.clamp(Duration::from_secs(300), Duration::from_secs(3600));
        let body = serde_json::to_value(CredentialRequest {
            endpoint: endpoint_resource.to_string(),
            ttl: duration_wire(ttl),
        })
        .map_err(|source| ApiConfigError::Encode {
            what: "credential request",
            source,
        })?;
        let mut segs: Vec<&str> = API.to_vec();
        segs.push("credentials");
        let url = self.rest.url(&segs)?;
        let cred: CredentialResponse = self
            .rest
            .call(Method::POST, url, Some(&body), "generate credential")
            .await?;
        if cred.token.expose().is_empty() {
            return Err(ApiError::Decode {
                what: "generate credential".into(),
                message: "empty token".into(),
            });
        }
        Ok(cred)
    }

    /// The caller's identity (`GET /api/2.0/preview/scim/v2/Me` → `userName`), which is the
    /// Postgres user name.
    pub async fn current_user(&self) -> Result<String, ApiError> {
        let url = self
            .rest
            .url(&["api", "2.0", "preview", "scim", "v2", "Me"])?;
        let me: Me = self
            .rest
            .call(Method::GET, url, None, "current user")
            .await?;
        me.user_name
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| ApiError::Decode {
                what: "current user".into(),
                message: "no userName".into(),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Secret;

    /// A REST client for `base` with the default retries and a test token.
    fn rest(base: &str) -> RestClient {
        RestClient::new(
            base,
            Secret::new("dapi-test"),
            super::super::retry::RetryPolicy::default(),
            Duration::from_secs(5),
        )
        .expect("rest")
    }

    fn client() -> LakebaseClient {
        let rest = rest("https://example.cloud.databricks.com");
        LakebaseClient::new(rest, "my-app", PollPolicy::default()).expect("client")
    }

    #[test]
    fn operation_urls_are_confined_to_the_api() {
        let c = client();
        let u = c
            .operation_url("projects/my-app/branches/b/operations/op-1")
            .expect("url");
        assert_eq!(
            u.as_str(),
            "https://example.cloud.databricks.com/api/2.0/postgres/projects/my-app/branches/b/operations/op-1"
        );
        for bad in [
            "",
            "x",
            "projects/../../admin",
            "projects//x",
            "projects/a?b=c",
            "a/b c",
        ] {
            assert!(c.operation_url(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn projects_must_be_resource_ids() {
        let rest = rest("https://x.com");
        assert!(LakebaseClient::new(rest.clone(), "a/b", PollPolicy::default()).is_err());
        assert!(LakebaseClient::new(rest, "", PollPolicy::default()).is_err());
    }
}
