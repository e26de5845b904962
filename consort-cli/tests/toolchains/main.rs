//! The `consort` program on other stacks' tools: the runner conformance matrix and adoption
//! (cargo, pytest, vitest, jest, go), a pytest project through psycopg, the Python service
//! and StockFlow examples, and `consort mcp` driven by the official MCP SDK for Python.

#[path = "../common/mod.rs"]
mod common;

mod adopt;
mod baseline;
mod examples;
mod lanes;
mod mcp;
mod pytest_project;
mod serving;
mod shared_file;
mod shared_file_more;
