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
    #[serde(skip_serializing_if = "Option::is_none")]
    pub source_branch: Option<String>,
    /// Time to live, `"3600s"`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ttl: Option<String>,
    /// Absolute expiry (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expire_time: Option<String>,
    /// Never expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub no_expiry: Option<bool>,
    /// Protected from deletion and reset.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_protected: Option<bool>,
}

/// The output part of a branch (`status`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchStatus {
    /// `INIT`, `READY`, `ARCHIVED`, `IMPORTING`, `RESETTING`, `DELETED`.
    pub current_state: Option<String>,
    /// Whether this is the project's default branch.
    pub default: Option<bool>,
    /// The branch it was forked from.
    pub source_branch: Option<String>,
    /// When it expires.
    pub expire_time: Option<String>,
    /// When it was (soft-)deleted.
    pub delete_time: Option<String>,
}

/// A branch resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BranchResource {
    /// `projects/{p}/branches/{b}` (output only).
    pub name: Option<String>,
    /// The system id, `br-…`.
    pub uid: Option<String>,
    /// When it was created (RFC 3339).
    pub create_time: Option<String>,
    /// Input.
    pub spec: Option<BranchSpec>,
    /// Output.
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
    pub next_page_token: Option<String>,
}

/// Endpoint type for a read-write compute.
pub const ENDPOINT_TYPE_READ_WRITE: &str = "ENDPOINT_TYPE_READ_WRITE";

/// The input part of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointSpec {
    /// `ENDPOINT_TYPE_READ_WRITE` or `ENDPOINT_TYPE_READ_ONLY`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub endpoint_type: Option<String>,
    /// Minimum compute units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscaling_limit_min_cu: Option<f64>,
    /// Maximum compute units.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoscaling_limit_max_cu: Option<f64>,
}

/// Where an endpoint answers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointHosts {
    /// The host name.
    pub host: Option<String>,
}

/// The output part of an endpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointStatus {
    /// Its type, as reported.
    pub endpoint_type: Option<String>,
    /// State (`ACTIVE`, `IDLE`, `INIT`, …).
    pub current_state: Option<String>,
    /// Hosts.
    pub hosts: Option<EndpointHosts>,
}

/// An endpoint (compute) resource.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EndpointResource {
    /// `projects/{p}/branches/{b}/endpoints/{e}`.
    pub name: Option<String>,
    /// Input.
    pub spec: Option<EndpointSpec>,
    /// Output.
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
    pub next_page_token: Option<String>,
}

/// The error of a finished operation (Google style `{code, message}`; Databricks may send
/// `error_code` instead).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OperationError {
    /// Numeric or symbolic code.
    pub code: Option<Value>,
    /// Databricks-style symbolic code.
    pub error_code: Option<String>,
    /// Message.
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
    pub name: Option<String>,
    /// Whether it has finished.
    pub done: Option<bool>,
    /// Set when it failed.
    pub error: Option<OperationError>,
    /// The resulting resource when it succeeded.
    pub response: Option<Value>,
    /// Progress metadata.
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

/// `POST /api/2.0/postgres/credentials` answer. The token is a [`crate::provider::Secret`]
/// from the moment it is read, so `Debug` shows it as `Secret(***)`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CredentialResponse {
    /// The password for the Postgres login.
    pub token: crate::provider::Secret,
    /// When it expires (RFC 3339).
    pub expire_time: Option<String>,
}

/// SCIM `GET /api/2.0/preview/scim/v2/Me` answer (the caller's identity).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Me {
    /// User e-mail, or a service principal's application id.
    #[serde(rename = "userName")]
    pub user_name: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credential_answer_never_shows_its_token() {
        let answer: CredentialResponse = serde_json::from_str(
            r#"{"token": "pw-s3cret-42", "expire_time": "2026-12-04T14:00:00Z"}"#,
        )
        .expect("a credential answer");
        assert_eq!(answer.token.expose(), "pw-s3cret-42");
        let shown = format!("{answer:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(shown.contains("2026-12-04T14:00:00Z"), "{shown}");
    }
}
