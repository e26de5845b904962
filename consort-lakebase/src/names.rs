//! Branch names, the owner prefix, and their PostgreSQL identifiers.
//!
//! Every branch Consort creates is named `consort-<tag>…` and matches
//! `^[a-z][a-z0-9-]{0,62}$` (the strictest form every backend accepts). Sweeping only ever
//! touches names with this prefix. In PostgreSQL the database and its login role are named
//! after the branch with `-` mapped to `_` (`consort-ab12cd-7` → `consort_ab12cd_7`); the
//! mapping is reversible because branch names never contain `_`.

use std::sync::atomic::{AtomicU64, Ordering};

use rand::Rng;

use crate::error::{Error, Result};

/// The fixed owner prefix of every branch name Consort creates.
pub const BRANCH_PREFIX: &str = "consort-";

/// The database-identifier form of [`BRANCH_PREFIX`].
pub const DB_PREFIX: &str = "consort_";

/// Whether `name` matches `^[a-z][a-z0-9-]{0,62}$`.
pub fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes[0].is_ascii_lowercase()
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
}

/// Checks that `name` is a valid branch name carrying Consort's owner prefix.
pub fn validate_branch_name(name: &str) -> Result<()> {
    let shown: String = name.chars().take(80).collect();
    if !is_valid_name(name) {
        return Err(Error::InvalidName(format!(
            "`{shown}` does not match ^[a-z][a-z0-9-]{{0,62}}$"
        )));
    }
    if !name.starts_with(BRANCH_PREFIX) || name.len() == BRANCH_PREFIX.len() {
        return Err(Error::InvalidName(format!(
            "`{shown}` lacks the owner prefix `{BRANCH_PREFIX}`"
        )));
    }
    Ok(())
}

/// The database (and role) identifier of a branch: `-` mapped to `_`.
pub fn db_ident(branch: &str) -> String {
    branch.replace('-', "_")
}

/// The branch name of a database identifier created by [`db_ident`], when it is one of ours.
pub fn branch_of_db(db: &str) -> Option<String> {
    if !db.starts_with(DB_PREFIX) || db.contains('-') {
        return None;
    }
    let name = db.replace('_', "-");
    validate_branch_name(&name).ok().map(|()| name)
}

/// Quotes a PostgreSQL identifier (`"` doubled).
pub fn quote_ident(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

/// Quotes a PostgreSQL string literal (`'` doubled; standard-conforming strings).
pub fn quote_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// `n` random lower-case alphanumerics (for run tags and generated names).
pub fn random_tag(n: usize) -> String {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let mut rng = rand::rng();
    (0..n)
        .map(|_| char::from(ALPHABET[rng.random_range(0..ALPHABET.len())]))
        .collect()
}

/// A random secret of 32 hex digits (128 bits).
pub fn random_password() -> String {
    let mut bytes = [0u8; 16];
    rand::rng().fill(&mut bytes);
    hex::encode(bytes)
}

/// Makes unique branch names `consort-<run>-<seq>` for one process or pool.
#[derive(Debug)]
pub struct BranchNamer {
    run: String,
    seq: AtomicU64,
}

impl BranchNamer {
    /// A namer with a fresh random run tag (a letter then five alphanumerics).
    pub fn new() -> Self {
        let mut run = String::from(char::from(b'a' + (rand::rng().random_range(0..26u8))));
        run.push_str(&random_tag(5));
        BranchNamer {
            run,
            seq: AtomicU64::new(0),
        }
    }

    /// The run tag.
    pub fn run(&self) -> &str {
        &self.run
    }

    /// The next name.
    pub fn next_name(&self) -> String {
        let n = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        format!("{BRANCH_PREFIX}{}-{n}", self.run)
    }
}

impl Default for BranchNamer {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_rules() {
        assert!(validate_branch_name("consort-ab12cd-1").is_ok());
        for bad in [
            "",
            "consort-",
            "Consort-x",
            "consort_x",
            "other-x",
            "1consort-x",
            "consort-x y",
            &format!("consort-{}", "a".repeat(60)),
        ] {
            assert!(
                matches!(validate_branch_name(bad), Err(Error::InvalidName(_))),
                "{bad:?} must be refused"
            );
        }
    }

    #[test]
    fn identifiers_round_trip_and_foreign_databases_are_not_ours() {
        let namer = BranchNamer::new();
        let a = namer.next_name();
        let b = namer.next_name();
        assert_ne!(a, b);
        validate_branch_name(&a).expect("generated names are valid");
        assert_eq!(branch_of_db(&db_ident(&a)).as_deref(), Some(a.as_str()));
        for foreign in [
            "postgres",
            "consort",
            "consorttpl_abc",
            "app_consort_x",
            "consort_",
        ] {
            assert_eq!(branch_of_db(foreign), None, "{foreign}");
        }
        assert_eq!(quote_ident("a\"b"), "\"a\"\"b\"");
        assert_eq!(quote_literal("it's"), "'it''s'");
        assert_eq!(random_password().len(), 32);
    }
}
