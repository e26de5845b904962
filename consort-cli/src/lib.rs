//! # The `consort` command line
//!
//! What the `consort` program adds to the [`consort`] library: the terminal ([`ui`]: progress,
//! summaries, the approver that asks on a terminal, signal handling), what `consort init` and
//! `consort doctor` do ([`init`], [`adopt`], [`collect`], [`script_check`]), `consort run
//! --parallel` ([`lanes`]), the read-only
//! [`views`] (`status`, `usage`, `log`, `verify`), the [`report`], the approval page
//! ([`serve`]) and the MCP server ([`mcp`]). The binary's argument parsing is `main.rs`.
//!
//! An embedder takes the `consort` library alone: none of this, and none of clap, indicatif,
//! axum or rmcp, is compiled into it.

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

pub mod adopt;
pub mod branch_env_found;
pub mod collect;
pub mod design_text;
pub mod init;
pub mod lanes;
pub mod mcp;
pub mod migration_tools;
pub mod report;
pub mod script_check;
pub mod serve;
pub mod trial;
pub mod ui;
pub mod views;
