//! SCRAM-SHA-256 password verifiers for branch roles (RFC 5802, RFC 7677).
//!
//! A branch role's password is 128 random bits ([`crate::names::random_password`]), made by
//! the provider and never chosen by a person. The PBKDF2 iteration count of a verifier only
//! slows down guessing a *guessable* password; against a random 128-bit key it adds nothing,
//! yet every client login pays it again (the client derives the salted password with the
//! server's count): about 2 ms of CPU at 4096. Branch verifiers still use RFC 7677's minimum
//! of 4096 ([`BRANCH_ITERATIONS`]), because clients hold servers to it: Go's `lib/pq` (dbmate,
//! many Go services) refuses a login with fewer ("invalid SCRAM-SHA-256 iteration count").
//!
//! People's passwords (the cluster's own administrator) keep PostgreSQL's default.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use hmac::{Hmac, KeyInit, Mac};
use rand::Rng;
use sha2::{Digest, Sha256};

/// PBKDF2 iterations of a branch role's verifier: RFC 7677's minimum, the fewest every client
/// accepts.
pub(crate) const BRANCH_ITERATIONS: u32 = 4096;

/// The verifier PostgreSQL stores for `password` (`SCRAM-SHA-256$<i>:<salt>$<stored>:<server>`),
/// with a fresh random 16-byte salt and `iterations` PBKDF2 rounds (at least 1).
///
/// The password is used as bytes, without SASLprep: callers pass ASCII (hex) passwords, which
/// SASLprep leaves unchanged.
pub(crate) fn verifier(password: &[u8], iterations: u32) -> String {
    let mut salt = [0u8; 16];
    rand::rng().fill(&mut salt);
    verifier_with_salt(password, &salt, iterations)
}

/// [`verifier`] with a given salt.
pub(crate) fn verifier_with_salt(password: &[u8], salt: &[u8], iterations: u32) -> String {
    let iterations = iterations.max(1);
    let salted = salted_password(password, salt, iterations);
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Sha256::digest(client_key);
    let server_key = hmac(&salted, b"Server Key");
    format!(
        "SCRAM-SHA-256${iterations}:{}${}:{}",
        STANDARD.encode(salt),
        STANDARD.encode(stored_key),
        STANDARD.encode(server_key)
    )
}

/// `text` with every SCRAM verifier (`SCRAM-SHA-256$…`, up to the next quote, white space,
/// comma, semicolon or parenthesis) replaced by `SCRAM-SHA-256$<redacted>`. For server logs
/// quoted in errors: PostgreSQL logs the text of a failed `CREATE ROLE … PASSWORD '…'`, and a
/// verifier is enough to mount an offline guess or impersonate the server to its clients.
pub(crate) fn redact_verifiers(text: &str) -> String {
    const TAG: &str = "SCRAM-SHA-256$";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(TAG) {
        out.push_str(&rest[..at]);
        out.push_str(TAG);
        out.push_str("<redacted>");
        let after = &rest[at + TAG.len()..];
        let end = after
            .find(|c: char| c.is_whitespace() || "'\",;()".contains(c))
            .unwrap_or(after.len());
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `Hi(password, salt, i)`: PBKDF2 with HMAC-SHA-256 and one 32-byte block.
fn salted_password(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let key = Hmac::<Sha256>::new_from_slice(password);
    // HMAC accepts keys of any length; the fallback only keeps this function total.
    let Ok(key) = key else {
        return [0; 32];
    };
    let mut first = key.clone();
    first.update(salt);
    first.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = first.finalize().into_bytes().into();
    let mut out = u;
    for _ in 1..iterations {
        let mut next = key.clone();
        next.update(&u);
        u = next.finalize().into_bytes().into();
        for (o, b) in out.iter_mut().zip(u) {
            *o ^= b;
        }
    }
    out
}

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    match Hmac::<Sha256>::new_from_slice(key) {
        Ok(mut mac) => {
            mac.update(data);
            mac.finalize().into_bytes().into()
        }
        Err(_) => [0; 32],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Splits `SCRAM-SHA-256$<i>:<salt>$<stored>:<server>`.
    fn parts(v: &str) -> (u32, Vec<u8>, String) {
        let rest = v.strip_prefix("SCRAM-SHA-256$").expect("prefix");
        let (head, keys) = rest.split_once('$').expect("keys");
        let (i, salt) = head.split_once(':').expect("salt");
        (
            i.parse().expect("count"),
            STANDARD.decode(salt).expect("base64 salt"),
            keys.to_string(),
        )
    }

    #[test]
    fn matches_the_postgres_protocol_verifier_at_its_count() {
        let password = b"0123456789abcdef0123456789abcdef";
        let theirs = postgres_protocol::password::scram_sha_256(password);
        let (count, salt, _) = parts(&theirs);
        assert_eq!(count, 4096);
        assert_eq!(verifier_with_salt(password, &salt, count), theirs);
    }

    #[test]
    fn verifiers_are_redacted_from_log_text() {
        let v = verifier(b"secret", BRANCH_ITERATIONS);
        let log = format!(
            "ERROR:  role \"x\" already exists\nSTATEMENT:  CREATE ROLE x LOGIN PASSWORD '{v}' IN ROLE y;\n{v}"
        );
        let clean = redact_verifiers(&log);
        assert!(!clean.contains(&v[20..]), "{clean}");
        assert_eq!(
            clean.matches("SCRAM-SHA-256$<redacted>").count(),
            2,
            "{clean}"
        );
        assert!(
            clean.contains("PASSWORD 'SCRAM-SHA-256$<redacted>' IN ROLE y;"),
            "{clean}"
        );
        assert_eq!(redact_verifiers("no secrets here"), "no secrets here");
    }

    #[test]
    fn branch_verifiers_carry_their_count_and_a_fresh_salt() {
        let a = verifier(b"secret", BRANCH_ITERATIONS);
        let b = verifier(b"secret", BRANCH_ITERATIONS);
        let (count, salt, _) = parts(&a);
        assert_eq!(count, BRANCH_ITERATIONS);
        assert_eq!(salt.len(), 16);
        assert_ne!(a, b, "each verifier has its own salt");
        assert_eq!(parts(&verifier(b"secret", 0)).0, 1, "at least one round");
    }
}
