//! Who may ask the server to decide a gate: only a page this server handed out, in a browser
//! that addressed this server by an address, not by a name someone else's DNS answers.
//!
//! Three checks, each on its own enough to stop a cross-site request and together what a
//! request to decide a gate must pass:
//! - **Host**: an IP literal or `localhost` with the port the server is bound to. A page of
//!   another site that re-points its own name at 127.0.0.1 (DNS rebinding) sends its own name
//!   and is refused, so it can never read a page and the token in it.
//! - **Origin** (and `Sec-Fetch-Site`): when the browser sends them, the request must come
//!   from this server's own origin.
//! - **Token**: the per-session token the server puts in its own forms, compared in constant
//!   time. No CORS header is ever sent, so no other origin can read a page to learn it.

use std::net::IpAddr;

/// Why a request was refused (said on the refusal page; never names the token).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The `Host` header is missing, a name, or another port.
    #[error(
        "the request addressed this server as {0}; open it by its address (http://127.0.0.1:<port>/)"
    )]
    Host(String),
    /// The request came from another origin.
    #[error("the request came from another site ({0}); decide gates from this server's own page")]
    CrossSite(String),
    /// The session token is missing or wrong.
    #[error(
        "the page's session token is missing or not this server's; reload the approval page and decide again"
    )]
    Token,
}

/// Checks `host` (the `Host` header): an IP literal or `localhost`, at `port`.
pub(super) fn check_host(host: Option<&str>, port: u16) -> Result<(), Refusal> {
    let shown = || host.unwrap_or("(no Host header)").to_string();
    let host = host.ok_or_else(|| Refusal::Host(shown()))?;
    let (name, given_port) = split_host(host).ok_or_else(|| Refusal::Host(shown()))?;
    let address = name == "localhost" || name.parse::<IpAddr>().is_ok();
    if address && given_port == Some(port) {
        Ok(())
    } else {
        Err(Refusal::Host(shown()))
    }
}

/// `name` and port of a `Host` value: `127.0.0.1:80`, `[::1]:80`, `localhost:80`.
fn split_host(host: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = host.strip_prefix('[') {
        let (name, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p.parse().ok()?),
            None if after.is_empty() => None,
            None => return None,
        };
        return Some((name, port));
    }
    match host.rsplit_once(':') {
        Some((name, port)) => Some((name, Some(port.parse().ok()?))),
        None => Some((host, None)),
    }
}

/// Checks `Origin` and `Sec-Fetch-Site` against `host` (already checked).
pub(super) fn check_origin(
    origin: Option<&str>,
    fetch_site: Option<&str>,
    host: &str,
) -> Result<(), Refusal> {
    if let Some(origin) = origin
        && origin != format!("http://{host}")
    {
        return Err(Refusal::CrossSite(origin.to_string()));
    }
    match fetch_site {
        None | Some("same-origin") | Some("none") => Ok(()),
        Some(other) => Err(Refusal::CrossSite(format!("Sec-Fetch-Site: {other}"))),
    }
}

/// Compares the token a form carried with the session's, in time that does not depend on
/// where they differ.
pub(super) fn check_token(given: &str, session: &str) -> Result<(), Refusal> {
    let (a, b) = (given.as_bytes(), session.as_bytes());
    let differs = a.len() != b.len() || a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) != 0;
    if differs || session.is_empty() {
        Err(Refusal::Token)
    } else {
        Ok(())
    }
}

/// A fresh session token: 128 random bits as hex.
pub(super) fn new_token() -> String {
    let bytes: [u8; 16] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_addresses_at_the_bound_port_are_this_server() {
        for ok in [
            "127.0.0.1:7340",
            "localhost:7340",
            "[::1]:7340",
            "10.0.0.5:7340",
        ] {
            assert_eq!(check_host(Some(ok), 7340), Ok(()), "{ok}");
        }
        for bad in [
            None,
            Some("evil.example:7340"),
            Some("127.0.0.1.nip.io:7340"),
            Some("127.0.0.1:7341"),
            Some("127.0.0.1"),
            Some("[::1]x:7340"),
            Some("127.0.0.1:notaport"),
        ] {
            assert!(check_host(bad, 7340).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn another_origin_is_refused_and_a_missing_one_is_left_to_the_token() {
        let host = "127.0.0.1:7340";
        assert_eq!(
            check_origin(Some("http://127.0.0.1:7340"), None, host),
            Ok(())
        );
        assert_eq!(check_origin(None, Some("same-origin"), host), Ok(()));
        assert_eq!(check_origin(None, None, host), Ok(()));
        assert!(check_origin(Some("http://evil.example"), None, host).is_err());
        assert!(check_origin(Some("null"), None, host).is_err());
        assert!(check_origin(None, Some("cross-site"), host).is_err());
        assert!(check_origin(None, Some("same-site"), host).is_err());
    }

    #[test]
    fn only_the_sessions_own_token_passes() {
        let t = new_token();
        assert_eq!(t.len(), 32);
        assert_ne!(t, new_token());
        assert_eq!(check_token(&t, &t), Ok(()));
        assert!(check_token("", &t).is_err());
        assert!(check_token(&t[..31], &t).is_err());
        assert!(check_token(&t.replace(&t[..1], "z"), &t).is_err());
        assert!(check_token("", "").is_err());
    }
}
