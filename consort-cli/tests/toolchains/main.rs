//! The `consort` program on other stacks' tools: the runner conformance matrix and adoption
//! (cargo, pytest, vitest, jest, go), a pytest project through psycopg, the Python service
//! and StockFlow examples, `consort mcp` driven by the official MCP SDK for Python, and the
//! Claude Code plugin checked by `claude plugin validate` with `consort mcp install`.

#[path = "../common/mod.rs"]
mod common;

mod adopt;
mod baseline;
mod examples;
mod lanes;
mod mcp;
mod migration_tools;
mod plugin;
mod pytest_project;
mod serving;
mod shared_file;
mod shared_file_more;
