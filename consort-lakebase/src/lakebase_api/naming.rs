//! Branch names, resource paths and durations in the wire format.

use std::time::Duration;

use super::error::{ApiConfigError, ApiError};

/// The longest branch id the service accepts (RFC 1123 label).
pub(super) const MAX_NAME_LEN: usize = 63;

/// Checks a branch id against `^[a-z][a-z0-9-]{0,62}$` (and refuses a trailing `-`, which
/// RFC 1123 labels do not allow).
pub(super) fn validate_branch_id(name: &str) -> Result<(), ApiError> {
    let refuse = |reason: &str| {
        Err(ApiError::InvalidName {
            name: name.chars().take(80).collect(),
            reason: reason.to_string(),
        })
    };
    let Some(first) = name.chars().next() else {
        return refuse("empty");
    };
    if name.len() > MAX_NAME_LEN {
        return refuse("longer than 63 characters");
    }
    if !first.is_ascii_lowercase() {
        return refuse("must start with a lower-case letter");
    }
    if let Some(bad) = name
        .chars()
        .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'))
    {
        return refuse(&format!(
            "'{}' is not allowed (only a-z, 0-9 and '-')",
            bad.escape_debug()
        ));
    }
    if name.ends_with('-') {
        return refuse("must not end with '-'");
    }
    Ok(())
}

/// Checks a branch id and that it carries the owner prefix (`<prefix>-…`), so that Consort
/// only ever creates, deletes or sweeps its own branches.
pub(super) fn validate_owned(name: &str, prefix: &str) -> Result<(), ApiError> {
    validate_branch_id(name)?;
    if !has_owner_prefix(name, prefix) {
        return Err(ApiError::InvalidName {
            name: name.chars().take(80).collect(),
            reason: format!("must start with the owner prefix \"{prefix}-\""),
        });
    }
    Ok(())
}

/// Whether `name` starts with `<prefix>-` (so `consortium` is not a `consort` branch).
pub(super) fn has_owner_prefix(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|rest| rest.starts_with('-') && rest.len() > 1)
}

/// Checks an id used as one path segment (project, endpoint): `[a-z0-9-]`, not empty, at
/// most 63 characters.
pub(super) fn validate_segment(kind: &'static str, value: &str) -> Result<(), ApiError> {
    let ok = !value.is_empty()
        && value.len() <= MAX_NAME_LEN
        && value
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(ApiConfigError::InvalidId {
            kind,
            value: value.chars().take(80).collect(),
        }
        .into())
    }
}

/// A duration in the protobuf JSON form the service uses: whole seconds, `"3600s"`.
pub(super) fn duration_wire(d: Duration) -> String {
    format!("{}s", d.as_secs().max(1))
}

/// The last segment of a resource name: `projects/p/branches/b` → `b`.
pub(super) fn last_segment(resource: &str) -> &str {
    resource.rsplit('/').next().unwrap_or(resource)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn branch_ids_follow_the_rfc1123_subset() {
        for ok in [
            "a",
            "consort-abc123-1",
            "x0-9",
            &format!("a{}", "b".repeat(62)),
        ] {
            assert!(validate_branch_id(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "1abc",
            "-abc",
            "Abc",
            "a_b",
            "a.b",
            "abc-",
            "a b",
            "é",
            &format!("a{}", "b".repeat(63)),
        ] {
            assert!(
                matches!(validate_branch_id(bad), Err(ApiError::InvalidName { .. })),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn owner_prefix_needs_the_dash() {
        assert!(has_owner_prefix("consort-1", "consort"));
        assert!(!has_owner_prefix("consortium", "consort"));
        assert!(!has_owner_prefix("consort-", "consort"));
        assert!(!has_owner_prefix("dev", "consort"));
        assert!(validate_owned("consortium-x", "consort").is_err());
    }

    #[test]
    fn durations_are_whole_seconds() {
        assert_eq!(duration_wire(Duration::from_secs(3600)), "3600s");
        assert_eq!(duration_wire(Duration::from_millis(1500)), "1s");
        assert_eq!(duration_wire(Duration::ZERO), "1s");
        assert_eq!(last_segment("projects/p/branches/b"), "b");
    }
}
