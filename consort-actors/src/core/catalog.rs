//! The database schema as it stands when a feature starts: the tables of the project's own
//! schemas after the project's migrations (whatever applied them), with their columns,
//! constraints and indexes, as the DBA is shown it. Read from a branch's catalog by the
//! Lakebase side and recorded in the feature's start, so a replay shows the DBA the same.

use serde::{Deserialize, Serialize};

/// The most tables a catalog lists; the rest are counted.
pub const MAX_CATALOG_TABLES: usize = 200;

/// The tables of a database's own schemas (`pg_catalog`, `information_schema` and the
/// `pg_toast` family left out).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SchemaCatalog {
    /// The tables, by schema-qualified name, at most [`MAX_CATALOG_TABLES`].
    pub tables: Vec<CatalogTable>,
    /// Tables past the cap, counted.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub more_tables: u64,
}

impl SchemaCatalog {
    /// The table named `name` (`schema.table`), when it is listed.
    pub fn table(&self, name: &str) -> Option<&CatalogTable> {
        self.tables.iter().find(|t| t.name == name)
    }
}

/// One table.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct CatalogTable {
    /// `schema.table`.
    pub name: String,
    /// Each column as SQL would declare it: `qty integer NOT NULL DEFAULT 0`.
    pub columns: Vec<String>,
    /// Each constraint, named: `items_pkey PRIMARY KEY (sku)`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub constraints: Vec<String>,
    /// Each index as `CREATE INDEX` would make it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub indexes: Vec<String>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
