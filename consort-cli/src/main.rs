//! `consort`: drive an ensemble of role agents through a spec-first, test-driven lifecycle.
//!
//! Exit codes: 0 done; 3 waiting at a gate; 4 halted by an escalation (or stopped); 2 usage or
//! configuration error; 1 any other failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::{Parser, Subcommand, ValueEnum};
use consort::actors::HumanDecision;
use consort::actors::{GateDecision, GateKind};
use consort::actors::{OfflineDecision, record_decision, record_human_decision};
use consort::backlog::FeatureState;
use consort::project::{Project, RunOptions, approve_command};
use consort::{ApproveAs, RunOutcome};
use consort_cli::ui::{self, EXIT_FAILURE, EXIT_USAGE};

#[derive(Parser, Debug)]
#[command(
    name = "consort",
    version,
    about = "Spec-first, test-driven agentic development on real database branches"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Write a commented consort.toml and the .consort/ folder (optionally an example project).
    Init {
        /// The project directory (created if missing).
        #[arg(default_value = ".")]
        dir: PathBuf,
        /// Also write an example's feature request and agent script.
        #[arg(long, value_enum)]
        example: Option<Example>,
        /// Overwrite an existing consort.toml (no other file is ever overwritten).
        #[arg(long)]
        force: bool,
        /// Print what would be written, and write nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Drive the ensemble until done, a gate, or an escalation.
    Run {
        #[command(flatten)]
        at: Target,
        /// Approve every gate as NAME (recorded in the ledger).
        #[arg(long, value_name = "NAME")]
        approve_as: Option<String>,
        /// Use this agent backend for every role instead of the configured ones.
        #[arg(long, value_enum)]
        agents: Option<AgentsChoice>,
        /// In a git repository, start a new run although the tree has uncommitted changes
        /// (Consort's commits hold only its own changes).
        #[arg(long)]
        allow_dirty: bool,
        /// Drive up to N unfinished features at once, each in its own git worktree
        /// (`<repository>.consort-lanes/<id>`, beside the repository) with its own database
        /// branches; with --feature, that one alone in its lane.
        #[arg(long, value_name = "N")]
        parallel: Option<usize>,
    },
    /// Run as `consort run` does, deciding gates on a local web page, with the live report.
    Serve {
        #[command(flatten)]
        at: Target,
        /// Where to listen: loopback by default; another address only when you name it.
        #[arg(long, default_value = "127.0.0.1:7340")]
        addr: std::net::SocketAddr,
        /// In a git repository, start a new run although the tree has uncommitted changes.
        #[arg(long)]
        allow_dirty: bool,
    },
    /// Phase, step, current test, pending gate and last receipt.
    Status {
        #[command(flatten)]
        at: Target,
        /// Print the stable JSON shape documented in the guide (docs/guide, The `consort` command).
        #[arg(long)]
        json: bool,
    },
    /// Approve a gate for an exact hash (recorded in the ledger).
    Approve {
        /// design, deploy or promote.
        gate: GateKind,
        /// The hash the gate waits for (64 hex digits).
        #[arg(long)]
        hash: String,
        /// Who approves.
        #[arg(long)]
        by: String,
        /// A note.
        #[arg(long, default_value = "")]
        note: String,
        #[command(flatten)]
        at: Target,
    },
    /// Reject a gate for an exact hash (the run halts for a human).
    Reject {
        /// design, deploy or promote.
        gate: GateKind,
        /// The hash the gate waits for.
        #[arg(long)]
        hash: String,
        #[command(flatten)]
        decision: Reasoned,
        #[command(flatten)]
        at: Target,
    },
    /// Retry the step a halted run stopped at (with fresh bounds).
    Retry {
        /// Who decides.
        #[arg(long)]
        by: String,
        #[command(flatten)]
        at: Target,
    },
    /// End a run: a halted one, one waiting at a gate, or one that was interrupted; not one
    /// whose promotion was approved (`consort run` finishes that). The work tree is put back as
    /// the last verified step left it (the unverified work stays in the ledger), unless --keep
    /// says to leave it.
    Stop {
        /// Who decides.
        #[arg(long)]
        by: String,
        /// Leave the work no run verified in the work tree (it is listed).
        #[arg(long)]
        keep: bool,
        #[command(flatten)]
        at: Target,
    },
    /// The ledger, one event per line.
    Log {
        #[command(flatten)]
        at: Target,
        /// The raw JSON Lines entries.
        #[arg(long)]
        json: bool,
    },
    /// Write the feature's run as one self-contained HTML page (no network needed) and print
    /// its path.
    Report {
        #[command(flatten)]
        at: Target,
        /// Write it here (default: report.html in the feature's record under .consort/).
        #[arg(long, value_name = "FILE")]
        out: Option<PathBuf>,
        /// Open it with xdg-open once written.
        #[arg(long)]
        open: bool,
    },
    /// Check the ledger chain, the frozen design hash, the frozen test hashes and the
    /// receipts: of every started feature, or of one (--feature).
    Verify {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Only this feature.
        #[arg(long, value_name = "ID")]
        feature: Option<String>,
    },
    /// The backlog: add a feature, list them.
    Feature {
        #[command(subcommand)]
        command: FeatureCmd,
    },
    /// Tests a person decides about: retire an earlier feature's test that a later feature
    /// contradicts, or have the running entry's wrong test written again.
    Test {
        #[command(subcommand)]
        command: TestCmd,
    },
    /// Run a command of yours (`npm test`, `pytest`) on a fresh branch of the project's
    /// database holding everything promoted, with the branch in its environment
    /// (`DATABASE_URL`, `PGHOST`, …); the branch is removed when it ends. Unconfined: it is your
    /// command, not a verification.
    Exec {
        #[command(flatten)]
        at: Target,
        /// The command and its arguments (after `--`).
        #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// List Consort's branches (and clean up with --sweep).
    Branches {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Delete the branches no live run holds (on any machine that shares the server), those
        /// kept for inspection, the templates no branch uses, and what killed runs left here.
        #[arg(long)]
        sweep: bool,
        /// With --sweep: every branch with Consort's prefix, a live run's too.
        #[arg(long, requires = "sweep")]
        all: bool,
    },
    /// Serve MCP over stdio: status, next, design, log, verify and branches for a coding
    /// client, and role play for the roles configured `backend = "mcp"`.
    #[command(args_conflicts_with_subcommands = true)]
    Mcp {
        #[command(subcommand)]
        install: Option<McpCmd>,
        #[command(flatten)]
        at: Target,
        /// The identity this session plays as (default: the client's declared name).
        #[arg(long = "as", value_name = "IDENTITY")]
        identity: Option<String>,
    },
    /// Check PostgreSQL binaries, the configuration, model and Lakebase settings.
    Doctor {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Also run the project's whole suite as a feature's baseline will, and list what
        /// fails there and why.
        #[arg(long)]
        baseline: bool,
    },
}

/// Who decides, and why: both are recorded in the ledger.
#[derive(clap::Args, Debug)]
struct Reasoned {
    /// Who decides.
    #[arg(long)]
    by: String,
    /// Why.
    #[arg(long)]
    reason: String,
}

/// Which project, and which feature of its backlog.
#[derive(clap::Args, Debug)]
struct Target {
    /// The project directory.
    #[arg(long, default_value = ".")]
    dir: PathBuf,
    /// The feature (default: the first of the backlog that is neither done nor stopped).
    #[arg(long, value_name = "ID")]
    feature: Option<String>,
}

impl Target {
    fn open(&self) -> Result<Project> {
        Ok(Project::open_feature(&self.dir, self.feature.as_deref())?)
    }
}

#[derive(Subcommand, Debug)]
enum McpCmd {
    /// Write a coding client's project configuration so that it starts `consort mcp` here:
    /// `.mcp.json` (Claude Code), `.cursor/mcp.json` (Cursor) or `.codex/config.toml` (Codex),
    /// merged into what is there; a different entry of the same name is never replaced.
    Install {
        /// The client.
        #[arg(value_enum)]
        client: consort_cli::mcp::install::Client,
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The identity the client's sessions play as (default: the client's name).
        #[arg(long = "as", value_name = "IDENTITY")]
        identity: Option<String>,
        /// The server's name in the client's configuration.
        #[arg(long, default_value = "consort")]
        name: String,
        /// The program the client starts (a path, when `consort` is not on its PATH).
        #[arg(long, default_value = "consort")]
        command: String,
    },
}

#[derive(Subcommand, Debug)]
enum FeatureCmd {
    /// Append a feature request to the backlog (its `# ` line is the title).
    Add {
        /// The request, as markdown.
        file: PathBuf,
        /// The feature's id (default: the file's name without its extension).
        #[arg(long)]
        id: Option<String>,
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Every feature of the backlog, in order, with where it stands.
    List {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Subcommand, Debug)]
enum TestCmd {
    /// Retire an earlier feature's test that no longer holds (recorded in the ledger of the
    /// feature that contradicts it); its RED may then replace the test.
    Retire {
        /// The test, as FEATURE/TEST (for example `F1-stock/T2`).
        test: String,
        #[command(flatten)]
        decision: Reasoned,
        #[command(flatten)]
        at: Target,
    },
    /// Quarantine a test that cannot pass where Consort runs it (the baseline names those that
    /// fail before the feature): its failures then judge nothing, and no agent is charged.
    /// Recorded in the ledger, named in every later run and in `verify`.
    Quarantine {
        /// The test, by the name the runner reports it under (as the baseline lists it).
        test: String,
        #[command(flatten)]
        decision: Reasoned,
        #[command(flatten)]
        at: Target,
    },
    /// Set aside the running entry's accepted test as wrong: its RED writes it again (the
    /// Navigator is told why), the rest of the feature stands. Only for a halted run.
    Redo {
        /// The test-list entry the build lane is on (for example `T2`).
        test: String,
        #[command(flatten)]
        decision: Reasoned,
        #[command(flatten)]
        at: Target,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Example {
    /// The StockFlow warehouse example.
    Stockflow,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AgentsChoice {
    /// The OpenAI-compatible backend for every role (see the guide's "Agent backends" for its variables).
    Openai,
    /// The configured backends (the default).
    Configured,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() { EXIT_USAGE as u8 } else { 0 });
        }
    };
    consort_cli::ui::init_logging();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the runtime: {e}");
            return ExitCode::from(EXIT_FAILURE as u8);
        }
    };
    let result = runtime.block_on(dispatch(cli.command));
    // Tasks still holding a server's handle are dropped (the server stops with its last
    // handle); a blocking read of the terminal is not waited for.
    runtime.shutdown_timeout(Duration::from_secs(30));
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {}", consort_actors::error_chain(e.as_ref()));
            let usage = e.chain().any(|c| {
                c.downcast_ref::<consort::config::ConfigError>().is_some()
                    || c.downcast_ref::<consort::backlog::BacklogError>()
                        .is_some_and(consort::backlog::BacklogError::is_usage)
                    || c.downcast_ref::<consort::records::RecordsError>()
                        .is_some_and(consort::records::RecordsError::is_usage)
                    || c.downcast_ref::<consort::ProjectError>()
                        .is_some_and(consort::ProjectError::is_usage)
                    || matches!(
                        c.downcast_ref::<consort_cli::views::ViewError>(),
                        Some(consort_cli::views::ViewError::Project(p)) if p.is_usage()
                    )
                    || matches!(
                        c.downcast_ref::<consort_cli::mcp::ServeError>(),
                        Some(consort_cli::mcp::ServeError::Project(p)) if p.is_usage()
                    )
                    || matches!(
                        c.downcast_ref::<consort_cli::serve::ServeError>(),
                        Some(consort_cli::serve::ServeError::Project(p)) if p.is_usage()
                    )
            });
            ExitCode::from(if usage { EXIT_USAGE } else { EXIT_FAILURE } as u8)
        }
    }
}

async fn dispatch(cmd: Cmd) -> Result<i32> {
    match cmd {
        Cmd::Init {
            dir,
            example,
            force,
            dry_run,
        } => init(
            &dir,
            example.map(|_| consort_cli::init::Example::Stockflow),
            force,
            dry_run,
        ),
        Cmd::Run {
            at,
            approve_as,
            agents,
            allow_dirty,
            parallel: None,
        } => run(&at, approve_as, agents, allow_dirty).await,
        Cmd::Run {
            at,
            approve_as,
            agents,
            parallel: Some(parallel),
            ..
        } => run_lanes(&at, parallel, approve_as, agents).await,
        Cmd::Serve {
            at,
            addr,
            allow_dirty,
        } => serve(&at, addr, allow_dirty).await,
        Cmd::Status { at, json } => status(&at, json),
        Cmd::Approve {
            gate,
            hash,
            by,
            note,
            at,
        } => decide(&at, gate, &hash, &by, GateDecision::Approve, note),
        Cmd::Reject {
            gate,
            hash,
            decision: Reasoned { by, reason },
            at,
        } => decide(
            &at,
            gate,
            &hash,
            &by,
            GateDecision::Reject {
                reason: reason.clone(),
            },
            reason,
        ),
        Cmd::Retry { by, at } => human(&at, HumanDecision::Retry, &by, false),
        Cmd::Stop { by, keep, at } => human(&at, HumanDecision::Stop, &by, keep),
        Cmd::Log { at, json } => log(&at, json),
        Cmd::Report { at, out, open } => report(&at, out.as_deref(), open),
        Cmd::Verify { dir, feature } => verify(&dir, feature.as_deref()),
        Cmd::Feature {
            command: FeatureCmd::Add { file, id, dir },
        } => feature_add(&dir, &file, id.as_deref()),
        Cmd::Feature {
            command: FeatureCmd::List { dir },
        } => feature_list(&dir),
        Cmd::Test { command } => test_decision(command),
        Cmd::Branches { dir, sweep, all } => branches(&dir, sweep, all).await,
        Cmd::Exec { at, command } => exec(&at, &command).await,
        Cmd::Mcp {
            install:
                Some(McpCmd::Install {
                    client,
                    dir,
                    identity,
                    name,
                    command,
                }),
            ..
        } => mcp_install(&dir, client, &name, &command, identity.as_deref()),
        Cmd::Mcp {
            install: None,
            at,
            identity,
        } => {
            consort_cli::mcp::serve(at.dir, at.feature, identity).await?;
            Ok(0)
        }
        Cmd::Doctor { dir, baseline } => Ok(consort_cli::init::doctor(&dir, baseline)),
    }
}

/// `consort mcp install CLIENT`: the entry written (or found), and where.
fn mcp_install(
    dir: &Path,
    client: consort_cli::mcp::install::Client,
    name: &str,
    command: &str,
    identity: Option<&str>,
) -> Result<i32> {
    use consort_cli::mcp::install::{Outcome, ServerEntry, install};
    let entry = ServerEntry::for_client(client, name, command, identity);
    let (path, outcome) = install(dir, client, &entry)?;
    let line = entry.command_line();
    match outcome {
        Outcome::Added => println!(
            "{}: added the server `{name}` to {} (it starts `{line}`)",
            client.label(),
            path.display()
        ),
        Outcome::AlreadyThere => println!(
            "{}: {} already has the server `{name}` as Consort writes it (`{line}`); nothing changed",
            client.label(),
            path.display()
        ),
    }
    Ok(0)
}

/// `consort init`: what it found, then the files written (or, with `--dry-run`, what would
/// be).
fn init(
    dir: &Path,
    example: Option<consort_cli::init::Example>,
    force: bool,
    dry_run: bool,
) -> Result<i32> {
    let plan = consort_cli::init::plan(dir, example);
    for note in &plan.notes {
        println!("{note}");
    }
    if dry_run {
        let mut text = String::new();
        for f in &plan.files {
            let replaced = f.kept && f.path.ends_with(consort::config::CONFIG_FILE) && force;
            match (f.kept, replaced) {
                (true, false) => {
                    text.push_str(&format!("would keep {} (it exists)\n", f.path.display()))
                }
                _ => text.push_str(&format!(
                    "would write {}:\n{}",
                    f.path.display(),
                    indent(&f.text)
                )),
            }
        }
        text.push_str("(dry run: nothing written)\n");
        // A reader that stops early (`| head`) is not an error.
        let _ = std::io::Write::write_all(&mut std::io::stdout(), text.as_bytes());
        return Ok(0);
    }
    let written = consort_cli::init::init(dir, example, force)?;
    for f in &plan.files {
        if written.contains(&f.path) {
            println!("wrote {}", f.path.display());
        } else {
            println!("kept {} (it exists)", f.path.display());
        }
    }
    if example.is_none() {
        println!(
            "next: fill in the answers in {} (every field is in docs/ARTIFACTS.md), check the project with `consort doctor --dir {}`, then",
            dir.join(consort_cli::init::SCRIPT_PATH).display(),
            dir.display()
        );
        println!("      consort run --dir {}", dir.display());
    } else {
        println!("next: consort run --dir {}", dir.display());
    }
    Ok(0)
}

/// `text` indented by four spaces, for showing a file's content.
fn indent(text: &str) -> String {
    text.lines().map(|l| format!("    {l}\n")).collect()
}

async fn run(
    at: &Target,
    approve_as: Option<String>,
    agents: Option<AgentsChoice>,
    allow_dirty: bool,
) -> Result<i32> {
    let dir = at.dir.as_path();
    let project = at.open()?;
    if ui::refuse_output_in_tree(&project) {
        return Ok(EXIT_USAGE);
    }
    // A done feature still goes through a run: it finishes at once, and its start-up sweep
    // removes what a crash right at the end left.
    let all_done =
        at.feature.is_none() && project.state_of(project.feature_entry())? == FeatureState::Done;
    if project.backlog()?.len() > 1 {
        println!("feature {}", project.feature_id());
    }
    // One run per project: refused here, before anything is printed, started or written.
    let lock = project.lock("consort run")?;
    let opts = run_options(approve_as, agents, allow_dirty)?;
    ui::print_budgets(&project, &opts)?;
    ui::print_mcp_roles(&project, &opts);
    let report = match ui::run_printed(&project, lock, opts).await {
        Err(consort::ProjectError::Interrupted(signal)) => {
            eprintln!(
                "interrupted by {signal}: the run is stopped and its database server shut down; `consort run --dir {}` resumes it",
                dir.display()
            );
            return Ok(signal.exit_code());
        }
        other => other?,
    };
    match &report.outcome {
        RunOutcome::AtGate { gate, hash } => {
            println!(
                "\nto continue, approve the {gate} gate:\n  {}",
                approve_command(dir, *gate, &hash.to_hex())
            );
            println!("then run again:\n  consort run --dir {}", dir.display());
        }
        RunOutcome::Halted { .. } => {
            println!("\nfix the cause, then retry the step or end the run:");
            println!("  consort retry --by <your-name> --dir {}", dir.display());
            println!("  consort stop --by <your-name> --dir {}", dir.display());
        }
        RunOutcome::Done if all_done => println!(
            "\nevery feature of the backlog is done ({} of them); add the next with:\n  consort feature add <request.md> --dir {}",
            project.backlog()?.len(),
            dir.display()
        ),
        RunOutcome::Done | RunOutcome::Stopped => {}
    }
    Ok(ui::exit_code(&report.outcome))
}

/// What `consort run` and `consort run --parallel` give every run.
fn run_options(
    approve_as: Option<String>,
    agents: Option<AgentsChoice>,
    allow_dirty: bool,
) -> Result<RunOptions> {
    let mut opts = RunOptions {
        allow_dirty,
        ..RunOptions::default()
    };
    if let Some(name) = approve_as {
        println!("approving every gate as {name} (recorded in the ledger)");
        opts.person = Some(name.clone());
        opts.approver = Some(Arc::new(ApproveAs { name }));
    }
    if let Some(AgentsChoice::Openai) = agents {
        opts.agents_override = Some(consort_cli::init::openai_from_env()?);
        opts.default_budgets = Some(consort::config::openai_default_budgets());
    }
    Ok(opts)
}

/// `consort run --parallel N`.
async fn run_lanes(
    at: &Target,
    parallel: usize,
    approve_as: Option<String>,
    agents: Option<AgentsChoice>,
) -> Result<i32> {
    let project = at.open()?;
    let mut run = run_options(approve_as, agents, false)?;
    run.command = Some("consort run --parallel".into());
    ui::print_budgets(&project, &run)?;
    let opts = consort::lanes::LaneOptions {
        parallel,
        features: at.feature.clone().map(|f| vec![f]),
        run,
        ..Default::default()
    };
    match consort_cli::lanes::run_parallel(&at.dir, opts).await {
        Err(consort::ProjectError::Interrupted(signal)) => {
            eprintln!(
                "interrupted by {signal}: the lanes are stopped and their database server shut down; `consort run --parallel {parallel} --dir {}` resumes them",
                at.dir.display()
            );
            Ok(signal.exit_code())
        }
        other => Ok(other?),
    }
}

async fn serve(at: &Target, addr: std::net::SocketAddr, allow_dirty: bool) -> Result<i32> {
    let project = at.open()?;
    if ui::refuse_output_in_tree(&project) {
        return Ok(EXIT_USAGE);
    }
    if project.backlog()?.len() > 1 {
        println!("feature {}", project.feature_id());
    }
    let lock = project.lock("consort serve")?;
    let opts = RunOptions {
        allow_dirty,
        ..RunOptions::default()
    };
    ui::print_budgets(&project, &opts)?;
    ui::print_mcp_roles(&project, &opts);
    match consort_cli::serve::serve(project, lock, addr, opts).await {
        Err(consort_cli::serve::ServeError::Project(consort::ProjectError::Interrupted(
            signal,
        ))) => {
            eprintln!(
                "interrupted by {signal}: the run is stopped and its database server shut down; `consort serve --dir {}` resumes it",
                at.dir.display()
            );
            Ok(signal.exit_code())
        }
        other => Ok(other?),
    }
}

fn status(at: &Target, json: bool) -> Result<i32> {
    let project = at.open()?;
    let report = consort_cli::views::status_report(&project)?;
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", consort_cli::views::status_text(&project, &report)?);
    }
    Ok(0)
}

fn decide(
    at: &Target,
    gate: GateKind,
    hash: &str,
    by: &str,
    decision: GateDecision,
    note: String,
) -> Result<i32> {
    use consort_cli::views::DecideError;
    let project = at.open()?;
    match consort_cli::views::decide_gate(&project, gate, hash, by, decision, note) {
        Ok(line) => {
            println!("{line}");
            Ok(0)
        }
        Err(e @ DecideError::BadHash(_)) => {
            eprintln!("{e}");
            Ok(EXIT_USAGE)
        }
        Err(DecideError::Refused(msg)) => {
            eprintln!("{msg}");
            Ok(EXIT_FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

fn human(at: &Target, decision: HumanDecision, by: &str, keep: bool) -> Result<i32> {
    let (dir, project) = (at.dir.as_path(), at.open()?);
    let _locks = project.lock_ledger(match decision {
        HumanDecision::Retry => "consort retry",
        HumanDecision::Stop => "consort stop",
    })?;
    if !project.has_started()? {
        eprintln!(
            "refused: feature {} has not started, so there is no run to {}; `consort run` takes it up in backlog order",
            project.feature_id(),
            match decision {
                HumanDecision::Retry => "retry",
                HumanDecision::Stop => "stop",
            }
        );
        return Ok(EXIT_FAILURE);
    }
    match project.record_judged(|log, machine| record_human_decision(log, machine, decision, by))? {
        Ok(()) if decision == HumanDecision::Stop => {
            println!("recorded: stop by {by}; the run is stopped");
            let work = project.unverified_work()?;
            let put_back = !keep && project.put_back_verified(&work)?;
            print!(
                "{}",
                consort_cli::ui::unverified_text(&work, put_back, keep)
            );
            // A stopped lane's worktree goes now (--keep keeps it, with the work in it).
            if !keep && project.remove_lane_worktree()? {
                println!(
                    "the lane's worktree {} is removed; its branch and records stay",
                    project.work_tree().display()
                );
            }
            Ok(0)
        }
        Ok(()) => {
            println!(
                "recorded: retry by {by}; run `consort run --dir {}` to continue{}",
                dir.display(),
                if project.in_lane() {
                    " (with --parallel N, as its lane ran)"
                } else {
                    ""
                }
            );
            Ok(0)
        }
        Err(consort::actors::ConductorError::Gate(msg)) => {
            eprintln!("{msg}");
            Ok(EXIT_FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

/// The feature's ledger as its lines (JSON, one an entry): the file itself, or with the
/// shared store each row's line, written again from its checked entry exactly as stored.
fn ledger_lines(project: &Project) -> Result<String> {
    if project.records().store().is_none() {
        let path = project.ledger_path();
        return std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()));
    }
    let mut text = String::new();
    for entry in project.entries()? {
        let (line, _) =
            consort::actors::entry_line(&entry.event, entry.seq, entry.prev, entry.time)?;
        text.push_str(&line);
        text.push('\n');
    }
    Ok(text)
}

fn log(at: &Target, json: bool) -> Result<i32> {
    let project = at.open()?;
    use std::io::Write;
    let text = if json {
        ledger_lines(&project)?
    } else {
        consort_cli::views::log_text(&project, None)?
    };
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        // The reader stopped reading (`consort log | head`): not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        other => {
            other.context("writing the log")?;
            Ok(0)
        }
    }
}

fn report(at: &Target, out: Option<&Path>, open: bool) -> Result<i32> {
    use consort_cli::report::{RenderOptions, ReportError};
    let project = at.open()?;
    let path = match consort_cli::report::write(&project, &RenderOptions::default(), out) {
        Ok(path) => path,
        Err(e @ ReportError::NotStarted { .. }) => {
            eprintln!("error: {e}");
            return Ok(EXIT_USAGE);
        }
        Err(e) => return Err(e.into()),
    };
    println!("{}", path.display());
    if open {
        match std::process::Command::new("xdg-open").arg(&path).status() {
            Ok(status) if status.success() => {}
            Ok(status) => eprintln!(
                "note: xdg-open could not open the report ({status}); open {} in a browser",
                path.display()
            ),
            Err(e) => eprintln!(
                "note: cannot run xdg-open ({e}); open {} in a browser",
                path.display()
            ),
        }
    }
    Ok(0)
}

fn verify(dir: &Path, only: Option<&str>) -> Result<i32> {
    let (ok, text) = consort_cli::views::verify_text(dir, only)?;
    print!("{text}");
    Ok(if ok { 0 } else { EXIT_FAILURE })
}

/// `consort feature add`: appends a request to the backlog.
fn feature_add(dir: &Path, file: &Path, id: Option<&str>) -> Result<i32> {
    let project = Project::open(dir)?;
    let _lock = project.lock("consort feature add")?;
    let added = project.records().add_feature(&project.config, file, id)?;
    let position = project.backlog()?.len();
    println!(
        "added feature {} (number {position} of the backlog); {}",
        added.id,
        request_kept(&project.config.store, &added.request)
    );
    println!(
        "`consort run --dir {}` takes it up once every feature before it is done",
        dir.display()
    );
    Ok(0)
}

/// Where an added feature's request is kept: the file, or the shared store every clone reads.
fn request_kept(store: &consort::config::StoreConfig, file: &Path) -> String {
    match store {
        consort::config::StoreConfig::Postgres { project, .. } => format!(
            "its request is kept in the shared store (project {project}), where every clone reads it, not in a file of this checkout"
        ),
        _ => format!("its request is kept in {}", file.display()),
    }
}

/// `consort feature list`: the backlog with each feature's state.
fn feature_list(dir: &Path) -> Result<i32> {
    let project = Project::open(dir)?;
    let current = project.feature_id().to_string();
    for (i, f) in project.backlog()?.iter().enumerate() {
        let at = Project::open_feature(dir, Some(&f.id))?;
        // The request file's title, or, for a legacy feature without one, the ledger's.
        let title = match at.feature() {
            Ok(request) => request.title,
            Err(_) => match at.state()?.feature {
                Some(request) => request.title.clone(),
                None => "(its request file is missing)".into(),
            },
        };
        let mark = if f.id == current { "→" } else { " " };
        println!(
            "{mark} {:>2}  {:<24} {:<20} {title}",
            i + 1,
            f.id,
            project.state_of(f)?.to_string()
        );
    }
    Ok(0)
}

/// How `consort test …` records a person's decision about a test: for a target, a test, by
/// whom and why.
type RecordDecision = fn(&Target, &str, &str, &str) -> Result<i32>;

/// `consort test …`: records a person's decision about a test.
fn test_decision(command: TestCmd) -> Result<i32> {
    let (record, test, Reasoned { by, reason }, at): (RecordDecision, _, _, _) = match command {
        TestCmd::Retire { test, decision, at } => (retire, test, decision, at),
        TestCmd::Quarantine { test, decision, at } => (quarantine, test, decision, at),
        TestCmd::Redo { test, decision, at } => (redo, test, decision, at),
    };
    record(&at, &test, &by, &reason)
}

/// `consort test retire FEATURE/TEST`: records the decision in the current feature's ledger.
fn retire(at: &Target, test: &str, by: &str, reason: &str) -> Result<i32> {
    let Some((feature, id)) = test.rsplit_once('/') else {
        eprintln!("refused: name the test as FEATURE/TEST, for example F1-stock/T2");
        return Ok(EXIT_USAGE);
    };
    let retirement = OfflineDecision::Retire(consort::actors::Retirement {
        feature: feature.to_string(),
        test: id.to_string(),
        by: by.to_string(),
        reason: reason.to_string(),
    });
    RETIREMENT.record(at, (by, reason), retirement, |project| {
        println!(
            "recorded: {test} retired by {by} for feature {}; its RED may now replace it",
            project.feature_id()
        );
        say_how_a_halted_run_goes_on(project, at, by, "and then `consort run` go on")
    })
}

/// `consort test quarantine TEST`: records the decision in the current feature's ledger.
fn quarantine(at: &Target, test: &str, by: &str, reason: &str) -> Result<i32> {
    let quarantine = OfflineDecision::Quarantine(consort::actors::Quarantine {
        test: test.to_string(),
        by: by.to_string(),
        reason: reason.to_string(),
    });
    QUARANTINE.record(at, (by, reason), quarantine, |project| {
        println!(
            "recorded: {test} quarantined by {by} for feature {}; its failures judge nothing from now on",
            project.feature_id()
        );
        let retry_does = "runs the baseline again, and `consort run` goes on";
        say_how_a_halted_run_goes_on(project, at, by, retry_does)
    })
}

/// `consort test redo TEST`: records that the running entry's accepted test is to be written
/// again, in the current feature's ledger.
fn redo(at: &Target, test: &str, by: &str, reason: &str) -> Result<i32> {
    let redo = OfflineDecision::Redo(consort::actors::Redo {
        test: test.to_string(),
        by: by.to_string(),
        reason: reason.to_string(),
    });
    REDO.record(at, (by, reason), redo, |_| {
        println!(
            "recorded: {test}'s test set aside by {by}; `consort run --dir {}` goes on from its RED",
            at.dir.display()
        );
        Ok(())
    })
}

/// When the feature's run is halted after a person's decision, says how it goes on:
/// `consort retry` (which `retry_does`) and `consort run`.
fn say_how_a_halted_run_goes_on(
    project: &Project,
    at: &Target,
    by: &str,
    retry_does: &str,
) -> Result<()> {
    if project.state()?.phase() == consort::actors::Phase::Halted {
        println!(
            "the run is halted: `consort retry --by {by} --dir {}` {retry_does}",
            at.dir.display()
        );
    }
    Ok(())
}

/// `consort test retire`, as its messages name it.
const RETIREMENT: TestDecision = TestDecision {
    command: "consort test retire",
    what: "a retirement",
    not_started: "; a test is retired for the feature that contradicts it, once it runs",
};

/// `consort test quarantine`, as its messages name it.
const QUARANTINE: TestDecision = TestDecision {
    command: "consort test quarantine",
    what: "a quarantine",
    not_started: "; a test is quarantined for a feature once it runs (its baseline names the tests that fail before it)",
};

/// `consort test redo`, as its messages name it.
const REDO: TestDecision = TestDecision {
    command: "consort test redo",
    what: "a redo",
    not_started: "",
};

/// A person's decision about a test (`consort test …`): how it is named in messages.
struct TestDecision {
    command: &'static str,
    what: &'static str,
    /// What the refusal of a feature that has not started adds.
    not_started: &'static str,
}

impl TestDecision {
    /// Records `decision` in the current feature's ledger, under its lock, then says so with
    /// `recorded`. A decision without a name and a reason is a usage error; one for a feature
    /// that has not started, or that the machine refuses, is refused.
    fn record(
        &self,
        at: &Target,
        (by, reason): (&str, &str),
        decision: OfflineDecision,
        recorded: impl FnOnce(&Project) -> Result<()>,
    ) -> Result<i32> {
        if by.trim().is_empty() || reason.trim().is_empty() {
            eprintln!(
                "refused: {} needs a name (--by) and a reason (--reason)",
                self.what
            );
            return Ok(EXIT_USAGE);
        }
        let project = at.open()?;
        if !project.has_started()? {
            eprintln!(
                "refused: feature {} has not started{}",
                project.feature_id(),
                self.not_started
            );
            return Ok(EXIT_FAILURE);
        }
        let _locks = project.lock_ledger(self.command)?;
        match project
            .record_judged(|log, machine| record_decision(log, machine, decision.clone()))?
        {
            Ok(()) => {
                recorded(&project)?;
                Ok(0)
            }
            Err(consort::actors::ConductorError::Gate(msg)) => {
                eprintln!("{msg}");
                Ok(EXIT_FAILURE)
            }
            Err(e) => Err(e.into()),
        }
    }
}

/// `consort exec -- COMMAND`: the command on a fresh branch of the parent (everything promoted),
/// in the project's directory; the branch goes when the command ends, whatever its end. Exits
/// with the command's exit code.
async fn exec(at: &Target, command: &[String]) -> Result<i32> {
    let Some((program, args)) = command.split_first() else {
        eprintln!(
            "refused: name the command to run after --, for example `consort exec -- npm test`"
        );
        return Ok(EXIT_USAGE);
    };
    let project = at.open()?;
    let mapped = project.branch_env()?;
    let provider = project.provider().await?;
    let base = provider
        .prepare_base(&consort_lakebase::BaseSpec {
            promoted: project.promoted_features()?,
            ..consort_lakebase::BaseSpec::default()
        })
        .await?;
    let name = consort_lakebase::names::BranchNamer::new().next_name();
    let branch = provider.create(&name, &base).await?;
    let ran = async {
        let conn = provider.connect_info(&branch).await?;
        eprintln!(
            "consort: `{}` runs on branch {} (everything promoted); it is removed when the command ends",
            command.join(" "),
            branch.name
        );
        let status = tokio::process::Command::new(program)
            .args(args)
            .envs(conn.env())
            .envs(mapped.render(&conn))
            .current_dir(project.work_tree())
            .status()
            .await
            .with_context(|| format!("starting {program}"))?;
        anyhow::Ok(status)
    }
    .await;
    if let Err(e) = provider.delete(&branch.name).await {
        eprintln!(
            "consort: branch {} could not be removed ({}); `consort branches --sweep` removes it",
            branch.name,
            consort::actors::error_chain(&e)
        );
    }
    let status = ran?;
    Ok(status.code().unwrap_or(EXIT_FAILURE))
}

async fn branches(dir: &Path, sweep: bool, all: bool) -> Result<i32> {
    let project = Project::open(dir)?;
    let provider = project.provider().await?;
    print!(
        "{}",
        consort_cli::views::branches_on(provider.as_ref()).await?
    );
    if sweep {
        let n = if all {
            provider.sweep(Duration::ZERO).await?
        } else {
            provider.sweep_unheld().await?
        };
        let which = if all {
            "every one, a live run's too"
        } else {
            "those no live run holds and those kept for inspection; a live run's stay"
        };
        println!(
            "swept {n} branch(es) ({which}), and with them the roles, half-built bases and unused base templates Consort made that nothing alive holds"
        );
        sweep_placed_clusters().await;
        let scratch = consort::lakebase::sweep_abandoned_scratch();
        let freed: u64 = scratch.iter().map(|(_, bytes)| bytes).sum();
        for (dir, bytes) in &scratch {
            println!("removed {}, {}", dir.display(), ui::bytes_text(*bytes));
        }
        println!(
            "scratch directories of killed runs: removed {} ({} freed)",
            scratch.len(),
            ui::bytes_text(freed)
        );
    }
    Ok(0)
}

/// `consort branches --sweep`: removes the cluster directories placed outside their projects
/// (`/tmp/consort-pg-*`) whose project no longer exists, and says which it keeps and why.
async fn sweep_placed_clusters() {
    use consort::lakebase::Placement;
    let (mut removed, mut freed, mut kept) = (0usize, 0u64, 0usize);
    for c in consort::lakebase::placed_clusters() {
        let of = c
            .requested
            .as_ref()
            .map(|r| format!(" (cluster of {})", r.display()))
            .unwrap_or_default();
        if c.state != Placement::Orphaned {
            if c.state != Placement::ProjectExists {
                println!("kept {}{of}: {}", c.dir.display(), c.state);
            }
            kept += 1;
            continue;
        }
        match consort::lakebase::remove_orphan(&c.dir).await {
            Ok(bytes) => {
                println!("removed {}{of}, {}", c.dir.display(), ui::bytes_text(bytes));
                removed += 1;
                freed += bytes;
            }
            Err(e) => {
                println!(
                    "kept {}{of}: {}",
                    c.dir.display(),
                    consort_actors::error_chain(&e)
                );
                kept += 1;
            }
        }
    }
    println!(
        "cluster directories outside their projects: removed {removed} ({} freed), kept {kept}",
        ui::bytes_text(freed)
    );
}
