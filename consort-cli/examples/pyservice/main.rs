//! The pyservice example: a small Python service (an item count over PostgreSQL) built by the
//! full ensemble with scripted agents, in an application language: its tests are pytest
//! files that reach the run's database branch through psycopg, run by the project's own
//! command with a JUnit report, so every RED and GREEN has per-test results.
//!
//! ```text
//! cargo run --example pyservice                     # a fresh temporary project, to done
//! cargo run --example pyservice -- --dir ./items    # in ./items, to inspect afterwards
//! ```
//!
//! Needs `python3` with `pytest` and `psycopg` (`pip install pytest 'psycopg[binary]'`). The
//! project is made a git repository, so `git log` there shows the TDD cycle. Every gate is
//! approved as the name `--approve-as` gives (default `pyservice-example`), said in the
//! output and the ledger.

#[path = "../shared/mod.rs"]
mod shared;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail};
use clap::Parser;
use consort::git::GitRepo;
use consort::project::{Project, RunOptions};
use consort::{ApproveAs, RunLock};
use consort_cli::ui;

const CONFIG: &str = include_str!("data/consort.toml");
const FEATURE: &str = include_str!("data/feature.md");
const SCRIPT: &str = include_str!("data/script.toml");

#[derive(Parser, Debug)]
#[command(name = "pyservice", about = "Run the Python service example ensemble")]
struct Args {
    /// The project directory (created if missing); default: a fresh temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Approve every gate as NAME.
    #[arg(long, value_name = "NAME", default_value = "pyservice-example")]
    approve_as: String,
}

fn main() {
    shared::main(run)
}

fn run() -> Result<i32> {
    let args = Args::parse();
    ui::init_logging();
    python_ready()?;
    let dir = shared::project_dir(args.dir, "pyservice")?;
    let lock = RunLock::acquire(&dir, "pyservice example")?;
    if !dir.join(consort::config::CONFIG_FILE).exists() {
        write_project(&dir)?;
    }
    println!("pyservice project: {}", dir.display());
    let project = Project::open(&dir)?;
    println!(
        "approving every gate as {} (recorded in the ledger)",
        args.approve_as
    );
    let opts = RunOptions {
        approver: Some(Arc::new(ApproveAs {
            name: args.approve_as,
        })),
        ..RunOptions::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let report = runtime.block_on(ui::run_printed(&project, lock, opts))?;
    if report.outcome == consort::RunOutcome::Done {
        println!("\nthe service: {}", dir.join("app/items.py").display());
        println!("its tests:   {}", dir.join("tests").display());
        println!(
            "check it yourself:\n  {}",
            ui::runnable(&format!("consort verify --dir {}", dir.display()))
        );
    }
    Ok(ui::exit_code(&report.outcome))
}

/// The project before the run: configuration, request, the agents' script, a git
/// repository with it committed.
fn write_project(dir: &Path) -> Result<()> {
    for (rel, text) in [
        (consort::config::CONFIG_FILE, CONFIG),
        ("feature.md", FEATURE),
        (".consort/agents/script.toml", SCRIPT),
    ] {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?;
    }
    if GitRepo::detect(dir).is_none() {
        match GitRepo::init_with_commit(dir, "pyservice example", "the service before the run") {
            Ok(_) => println!("git repository made; the run commits on its own branch"),
            Err(e) => println!("no git repository ({e}); the run makes no commits"),
        }
    }
    Ok(())
}

/// Python with pytest and psycopg, or a message saying how to get them.
fn python_ready() -> Result<()> {
    let ok = std::process::Command::new("python3")
        .args(["-c", "import pytest, psycopg"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        bail!(
            "this example needs python3 with pytest and psycopg: pip install pytest 'psycopg[binary]'"
        );
    }
    Ok(())
}
