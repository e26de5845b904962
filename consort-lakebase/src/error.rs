//! The crate's error type.

/// Everything that can go wrong on the database side. Test failures are not errors: they are
/// outcomes in a receipt.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Placeholder until the backends land.
    #[error("{0}")]
    Other(String),
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
