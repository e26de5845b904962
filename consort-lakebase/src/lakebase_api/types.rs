//! Lakebase Autoscaling JSON shapes (field names as on the wire, `/api/2.0/postgres/…`).
//!
//! Only the fields Consort reads or writes are modelled; unknown fields are ignored, and
//! every output field is optional because the service may omit it.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The input part of a branch (`spec`). Exactly one expiry policy must be set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchSpec {
    /// Full resource name of the branch to fork from (`projects/p/branches/b`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_branch: Option<String>,
    /// Time to live, `"3600s"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Absolute expiry (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expire_time: Option<String>,
    /// Never expires.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_expiry: Option<bool>,
    /// Protected from deletion and reset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_protected: Option<bool>,
}

/// The output part of a branch (`status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchStatus {
    /// `INIT`, `READY`, `ARCHIVED`, `IMPORTING`, `RESETTING`, `DELETED`.
    #[serde(default)]
    pub current_state: Option<String>,
    /// Whether this is the project's default branch.
    #[serde(default)]
    pub default: Option<bool>,
    /// The branch it was forked from.
    #[serde(default)]
    pub source_branch: Option<String>,
    /// When it expires.
    #[serde(default)]
    pub expire_time: Option<String>,
    /// When it was (soft-)deleted.
    #[serde(default)]
    pub delete_time: Option<String>,
}

/// A branch resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchResource {
    /// `projects/{p}/branches/{b}` (output only).
    #[serde(default)]
    pub name: Option<String>,
    /// The system id, `br-…`.
    #[serde(default)]
    pub uid: Option<String>,
    /// When it was created (RFC 3339).
    #[serde(default)]
    pub create_time: Option<String>,
    /// Input.
    #[serde(default)]
    pub spec: Option<BranchSpec>,
    /// Output.
    #[serde(default)]
    pub status: Option<BranchStatus>,
}

impl BranchResource {
    /// The branch id (last segment of `name`).
    pub fn id(&self) -> Option<&str> {
        self.name.as_deref().map(super::naming::last_segment)
    }

    /// The source branch, from `status` or else `spec`.
    pub fn source(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.source_branch.as_deref())
            .or_else(|| self.spec.as_ref().and_then(|s| s.source_branch.as_deref()))
    }

    /// The current state, when reported.
    pub fn state(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.current_state.as_deref())
    }

    /// Whether the service marks it as the project's default branch.
    pub fn is_default(&self) -> bool {
        self.status
            .as_ref()
            .and_then(|s| s.default)
            // Not marked is not the default.
            .unwrap_or(false)
    }
}

/// A page of `GET …/branches`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListBranchesResponse {
    /// The branches on this page.
    #[serde(default)]
    pub branches: Vec<BranchResource>,
    /// Token of the next page; absent or empty on the last one.
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// Endpoint type for a read-write compute.
pub const ENDPOINT_TYPE_READ_WRITE: &str = "ENDPOINT_TYPE_READ_WRITE";

/// The input part of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// `ENDPOINT_TYPE_READ_WRITE` or `ENDPOINT_TYPE_READ_ONLY`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_type: Option<String>,
    /// Minimum compute units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_limit_min_cu: Option<f64>,
    /// Maximum compute units.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling_limit_max_cu: Option<f64>,
}

/// Where an endpoint answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointHosts {
    /// The host name.
    #[serde(default)]
    pub host: Option<String>,
}

/// The output part of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointStatus {
    /// Its type, as reported.
    #[serde(default)]
    pub endpoint_type: Option<String>,
    /// State (`ACTIVE`, `IDLE`, `INIT`, …).
    #[serde(default)]
    pub current_state: Option<String>,
    /// Hosts.
    #[serde(default)]
    pub hosts: Option<EndpointHosts>,
}

/// An endpoint (compute) resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointResource {
    /// `projects/{p}/branches/{b}/endpoints/{e}`.
    #[serde(default)]
    pub name: Option<String>,
    /// Input.
    #[serde(default)]
    pub spec: Option<EndpointSpec>,
    /// Output.
    #[serde(default)]
    pub status: Option<EndpointStatus>,
}

impl EndpointResource {
    /// Whether it is a read-write endpoint (by status, else spec).
    pub fn is_read_write(&self) -> bool {
        let t = self
            .status
            .as_ref()
            .and_then(|s| s.endpoint_type.as_deref())
            .or_else(|| self.spec.as_ref().and_then(|s| s.endpoint_type.as_deref()));
        t == Some(ENDPOINT_TYPE_READ_WRITE)
    }

    /// The host, when one is assigned.
    pub fn host(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.hosts.as_ref())
            .and_then(|h| h.host.as_deref())
            .filter(|h| !h.trim().is_empty())
    }
}

/// A page of `GET …/endpoints`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ListEndpointsResponse {
    /// The endpoints.
    #[serde(default)]
    pub endpoints: Vec<EndpointResource>,
    /// Token of the next page.
    #[serde(default)]
    pub next_page_token: Option<String>,
}

/// The error of a finished operation (Google style `{code, message}`; Databricks may send
/// `error_code` instead).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperationError {
    /// Numeric or symbolic code.
    #[serde(default)]
    pub code: Option<Value>,
    /// Databricks-style symbolic code.
    #[serde(default)]
    pub error_code: Option<String>,
    /// Message.
    #[serde(default)]
    pub message: Option<String>,
}

impl OperationError {
    /// The symbolic code when given, else the numeric one as text, else `UNKNOWN`.
    pub fn code_text(&self) -> String {
        if let Some(c) = &self.error_code {
            return c.clone();
        }
        match &self.code {
            Some(Value::String(s)) => s.clone(),
            Some(Value::Number(n)) => n.to_string(),
            _ => "UNKNOWN".to_string(),
        }
    }
}

/// A long-running operation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Operation {
    /// Its name, polled at `GET /api/2.0/postgres/{name}`.
    #[serde(default)]
    pub name: Option<String>,
    /// Whether it has finished.
    #[serde(default)]
    pub done: Option<bool>,
    /// Set when it failed.
    #[serde(default)]
    pub error: Option<OperationError>,
    /// The resulting resource when it succeeded.
    #[serde(default)]
    pub response: Option<Value>,
    /// Progress metadata.
    #[serde(default)]
    pub metadata: Option<Value>,
}

/// `POST /api/2.0/postgres/credentials` request.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CredentialRequest {
    /// `projects/p/branches/b/endpoints/e`.
    pub endpoint: String,
    /// Lifetime, `"3600s"` (300 s – 3600 s).
    pub ttl: String,
}

/// `POST /api/2.0/postgres/credentials` answer. Deliberately not `Debug`-printable as is:
/// the token is wrapped in [`crate::provider::Secret`] as soon as it is read.
#[derive(Clone, PartialEq, Deserialize)]
pub struct CredentialResponse {
    /// The password for the Postgres login.
    pub token: crate::provider::Secret,
    /// When it expires (RFC 3339).
    #[serde(default)]
    pub expire_time: Option<String>,
}

impl std::fmt::Debug for CredentialResponse {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CredentialResponse")
            .field("token", &self.token)
            .field("expire_time", &self.expire_time)
            .finish()
    }
}

/// SCIM `GET /api/2.0/preview/scim/v2/Me` answer (the caller's identity).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Me {
    /// User e-mail, or a service principal's application id.
    #[serde(default, rename = "userName")]
    pub user_name: Option<String>,
}
