//! The `consort` program on PostgreSQL: each module drives the built program (or the StockFlow
//! example) in temporary projects on the embedded cluster. Needs the PostgreSQL server binaries
//! and `git`.

#[path = "../common/mod.rs"]
mod common;

mod backlog;
mod budgets;
mod cli;
mod embedded_resume;
mod git;
mod lanes;
mod machines;
mod openai_ensemble;
mod scripts;
mod store;
