//! Reading a database's own tables (see [`consort_actors::SchemaCatalog`]): what the DBA is
//! shown of the schema as it stands, whatever made it — Consort's SQL files, a psql script or
//! the project's migration tool.

use consort_actors::{CatalogTable, MAX_CATALOG_TABLES, SchemaCatalog};

use crate::error::{Error, Result};
use crate::provider::ConnectInfo;

/// The schemas that are PostgreSQL's own.
const SYSTEM_SCHEMAS: &str =
    "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'";

/// The tables (ordinary and partitioned) of the database `conn` reaches, by schema and name,
/// each with its columns, constraints and indexes.
pub async fn read_catalog(conn: &ConnectInfo) -> Result<SchemaCatalog> {
    let client = crate::pgconn::connect(conn).await?;
    let read = |e| Error::from_pg("reading the database's catalog", e);
    let tables = client
        .query(
            &format!(
                "SELECT c.oid, format('%I.%I', n.nspname, c.relname) FROM pg_class c \
                 JOIN pg_namespace n ON n.oid = c.relnamespace \
                 WHERE c.relkind IN ('r', 'p') AND {SYSTEM_SCHEMAS} ORDER BY 2"
            ),
            &[],
        )
        .await
        .map_err(read)?;
    let mut catalog = SchemaCatalog {
        more_tables: tables.len().saturating_sub(MAX_CATALOG_TABLES) as u64,
        ..SchemaCatalog::default()
    };
    for row in tables.iter().take(MAX_CATALOG_TABLES) {
        let oid: u32 = row.get(0);
        let texts = |sql: &'static str| {
            let client = &client;
            async move {
                let rows = client.query(sql, &[&oid]).await.map_err(read)?;
                Ok::<Vec<String>, Error>(rows.iter().map(|r| r.get(0)).collect())
            }
        };
        catalog.tables.push(CatalogTable {
            name: row.get(1),
            columns: texts(
                "SELECT format('%I %s', a.attname, format_type(a.atttypid, a.atttypmod)) \
                 || CASE WHEN a.attnotnull THEN ' NOT NULL' ELSE '' END \
                 || coalesce(' DEFAULT ' || pg_get_expr(d.adbin, d.adrelid), '') \
                 FROM pg_attribute a LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum \
                 WHERE a.attrelid = $1 AND a.attnum > 0 AND NOT a.attisdropped ORDER BY a.attnum",
            )
            .await?,
            constraints: texts(
                "SELECT format('%I ', conname) || pg_get_constraintdef(oid) FROM pg_constraint \
                 WHERE conrelid = $1 ORDER BY conname",
            )
            .await?,
            indexes: texts(
                "SELECT pg_get_indexdef(indexrelid) FROM pg_index WHERE indrelid = $1 \
                 ORDER BY indexrelid::regclass::text",
            )
            .await?,
        });
    }
    Ok(catalog)
}
