//! Database branches and real test runs for Consort.

pub mod error;
pub mod lakebase_api;
pub mod provider;

pub use error::{Error, Result};
pub use provider::*;
