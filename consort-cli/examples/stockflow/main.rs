//! The StockFlow example: a small warehouse app built by the full ensemble with scripted agents,
//! on the embedded PostgreSQL, with SQL migrations from the DBA and SQL tests run by psql.
//!
//! ```text
//! cargo run --example stockflow                       # a fresh temporary project; asks at each gate on a terminal
//! cargo run --example stockflow -- --approve-as ada   # approves every gate as "ada" (said in the output and the ledger)
//! cargo run --example stockflow -- --dir ./sf         # in ./sf (created if missing), to inspect or resume afterwards
//! cargo run --example stockflow -- --agents openai    # every role on an OpenAI-compatible server (see the guide)
//! ```
//!
//! Without a terminal and without `--approve-as`, it stops at the design gate with exit code 3
//! and prints the exact `consort approve` command that continues it. Like `consort run`, it
//! holds the project's run lock: one run per project.

#[path = "../shared/mod.rs"]
mod shared;

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Result;
use clap::{Parser, ValueEnum};
use consort::git::GitRepo;
use consort::project::{Project, RunOptions, approve_command};
use consort::{ApproveAs, RunLock, RunOutcome};
use consort_cli::ui::{self, TerminalApprover};

#[derive(Parser, Debug)]
#[command(name = "stockflow", about = "Run the StockFlow example ensemble")]
struct Args {
    /// The project directory (created if missing); default: a fresh temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Approve every gate as NAME.
    #[arg(long, value_name = "NAME")]
    approve_as: Option<String>,
    /// Which agents play the roles.
    #[arg(long, value_enum, default_value = "scripted")]
    agents: Agents,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Agents {
    /// The recorded StockFlow script (deterministic).
    Scripted,
    /// An OpenAI-compatible server for every role.
    Openai,
}

fn main() {
    shared::main(run)
}

fn run() -> Result<i32> {
    let args = Args::parse();
    consort_cli::ui::init_logging();
    let dir = shared::project_dir(args.dir, "stockflow")?;
    // One run per project: taken before the project is even written, held to the end.
    let lock = RunLock::acquire(&dir, "stockflow example")?;
    if !dir.join(consort::config::CONFIG_FILE).exists() {
        consort_cli::init::init(&dir, Some(consort_cli::init::Example::Stockflow), false)?;
        // A git repository of its own, so that `git log` shows the run's TDD cycle.
        if GitRepo::detect(&dir).is_none() {
            match GitRepo::init_with_commit(&dir, "StockFlow example", "StockFlow before the run") {
                Ok(_) => println!("git repository made; the run commits on its own branch"),
                Err(e) => println!("no git repository ({e}); the run makes no commits"),
            }
        }
    }
    println!("StockFlow project: {}", dir.display());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    runtime.block_on(drive(dir, lock, args.approve_as, args.agents))
}

async fn drive(
    dir: PathBuf,
    lock: RunLock,
    approve_as: Option<String>,
    agents: Agents,
) -> Result<i32> {
    let project = Project::open(&dir)?;
    let mut opts = RunOptions::default();
    if let Some(name) = approve_as {
        println!("approving every gate as {name} (recorded in the ledger)");
        opts.approver = Some(Arc::new(ApproveAs { name }));
    } else if ui::is_terminal() {
        let name = std::env::var("USER").unwrap_or_else(|_| "you".into());
        opts.approver = Some(Arc::new(TerminalApprover {
            name,
            design_file: project.design_path(),
        }));
    }
    if let Agents::Openai = agents {
        opts.agents_override = Some(consort_cli::init::openai_from_env()?);
        opts.default_budgets = Some(consort::config::openai_default_budgets());
    }
    ui::print_budgets(&project, &opts)?;
    let report = ui::run_printed(&project, lock, opts).await?;
    match &report.outcome {
        RunOutcome::AtGate { gate, hash } => {
            println!("\nstopped at the {gate} gate. To approve it and continue:");
            println!(
                "  {}",
                ui::runnable(&approve_command(&dir, *gate, &hash.to_hex()))
            );
            println!("  cargo run --example stockflow -- --dir {}", dir.display());
        }
        RunOutcome::Done => println!(
            "\ncheck it yourself:\n  {}",
            ui::runnable(&format!("consort verify --dir {}", dir.display()))
        ),
        _ => {}
    }
    Ok(ui::exit_code(&report.outcome))
}
