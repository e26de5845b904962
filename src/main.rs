//! `consort`: drive an ensemble of role agents through a spec-first, test-driven lifecycle.
//!
//! Exit codes: 0 done; 3 waiting at a gate; 4 halted by an escalation (or stopped); 2 usage or
//! configuration error; 1 any other failure.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chrono::Utc;
use clap::{Parser, Subcommand, ValueEnum};
use consort::actors::HumanDecision;
use consort::actors::Ledger;
use consort::actors::{ContentHash, Event, GateApproval, GateDecision, GateKind, WorkTree};
use consort::actors::{design_hash_on_disk, record_gate_decision, record_human_decision};
use consort::project::{Project, RunOptions, approve_command, status_of};
use consort::ui::{self, EXIT_FAILURE, EXIT_USAGE};
use consort::{ApproveAs, RunOutcome};

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
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
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
    },
    /// Phase, step, current test, pending gate and last receipt.
    Status {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Print the stable JSON shape documented in the README.
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
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Reject a gate for an exact hash (the run halts for a human).
    Reject {
        /// design, deploy or promote.
        gate: GateKind,
        /// The hash the gate waits for.
        #[arg(long)]
        hash: String,
        /// Who rejects.
        #[arg(long)]
        by: String,
        /// Why.
        #[arg(long)]
        reason: String,
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Retry the step a halted run stopped at (with fresh bounds).
    Retry {
        /// Who decides.
        #[arg(long)]
        by: String,
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// End a run: a halted one, one waiting at a gate, or one that was interrupted.
    Stop {
        /// Who decides.
        #[arg(long)]
        by: String,
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// The ledger, one event per line.
    Log {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The raw JSON Lines entries.
        #[arg(long)]
        json: bool,
    },
    /// Check the ledger chain, the frozen design hash, the frozen test hashes and the receipts.
    Verify {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// List Consort's branches (and delete them with --sweep).
    Branches {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// Delete every branch with Consort's prefix.
        #[arg(long)]
        sweep: bool,
    },
    /// Check PostgreSQL binaries, the configuration, model and Lakebase settings.
    Doctor {
        /// The project directory.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Example {
    /// The StockFlow warehouse example.
    Stockflow,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AgentsChoice {
    /// The OpenAI-compatible backend for every role (see the README for its variables).
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
    consort::ui::init_logging();
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
    match runtime.block_on(dispatch(cli.command)) {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            eprintln!("error: {}", consort::ui::error_chain(e.as_ref()));
            let usage = e.chain().any(|c| {
                c.downcast_ref::<consort::config::ConfigError>().is_some()
                    || matches!(
                        c.downcast_ref::<consort::ProjectError>(),
                        Some(consort::ProjectError::Config(_))
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
            example.map(|_| consort::init::Example::Stockflow),
            force,
            dry_run,
        ),
        Cmd::Run {
            dir,
            approve_as,
            agents,
            allow_dirty,
        } => run(&dir, approve_as, agents, allow_dirty).await,
        Cmd::Status { dir, json } => status(&dir, json),
        Cmd::Approve {
            gate,
            hash,
            by,
            note,
            dir,
        } => decide(&dir, gate, &hash, &by, GateDecision::Approve, note),
        Cmd::Reject {
            gate,
            hash,
            by,
            reason,
            dir,
        } => decide(
            &dir,
            gate,
            &hash,
            &by,
            GateDecision::Reject {
                reason: reason.clone(),
            },
            reason,
        ),
        Cmd::Retry { by, dir } => human(&dir, HumanDecision::Retry, &by),
        Cmd::Stop { by, dir } => human(&dir, HumanDecision::Stop, &by),
        Cmd::Log { dir, json } => log(&dir, json),
        Cmd::Verify { dir } => verify(&dir),
        Cmd::Branches { dir, sweep } => branches(&dir, sweep).await,
        Cmd::Doctor { dir } => Ok(consort::init::doctor(&dir)),
    }
}

/// `consort init`: what it found, then the files written (or, with `--dry-run`, what would
/// be).
fn init(
    dir: &Path,
    example: Option<consort::init::Example>,
    force: bool,
    dry_run: bool,
) -> Result<i32> {
    let plan = consort::init::plan(dir, example);
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
    let written = consort::init::init(dir, example, force)?;
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
            dir.join(consort::init::SCRIPT_PATH).display(),
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
    dir: &Path,
    approve_as: Option<String>,
    agents: Option<AgentsChoice>,
    allow_dirty: bool,
) -> Result<i32> {
    let project = Project::open(dir)?;
    // One run per project: refused here, before anything is printed, started or written.
    let lock = project.lock("consort run")?;
    let mut opts = RunOptions {
        allow_dirty,
        ..RunOptions::default()
    };
    if let Some(name) = &approve_as {
        println!("approving every gate as {name} (recorded in the ledger)");
        opts.approver = Some(Arc::new(ApproveAs { name: name.clone() }));
    }
    if let Some(AgentsChoice::Openai) = agents {
        opts.agents_override = Some(consort::init::openai_from_env()?);
        opts.default_budgets = Some(consort::config::openai_default_budgets());
    }
    ui::print_budgets(&project, &opts)?;
    let report = ui::run_printed(&project, lock, opts).await?;
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
        RunOutcome::Done | RunOutcome::Stopped => {}
    }
    Ok(ui::exit_code(&report.outcome))
}

fn status(dir: &Path, json: bool) -> Result<i32> {
    let project = Project::open(dir)?;
    let state = project.state()?;
    let events = if project.ledger_path().exists() {
        Ledger::<Event>::read(project.ledger_path())?
    } else {
        Vec::new()
    };
    let usage = consort::actors::usage_totals(events.iter().map(|e| &e.event));
    let mut report = status_of(&state, events.len(), &usage);
    report.git = project.git_tip();
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(0);
    }
    println!("phase:   {}", report.phase);
    if let Some(step) = &report.step {
        println!("step:    {step}");
    }
    if let Some(t) = &report.test {
        println!("test:    {} ({} of {})", t.id, t.index, t.of);
    }
    if let Some(g) = &report.pending_gate {
        println!("gate:    {} waits for {}", g.gate, g.hash);
        println!("         {}", approve_command(dir, g.gate, &g.hash));
    }
    if let Some(h) = &report.halted {
        println!(
            "halted:  {} ({}) at {}: {}",
            h.reason, h.kind, h.step, h.detail
        );
        println!(
            "         consort retry --by <your-name> --dir {}",
            dir.display()
        );
    }
    if let Some(r) = &report.last_receipt {
        println!(
            "receipt: req-{} on {}: {} passed, {} not passed (confined: {})",
            r.request, r.branch, r.passed, r.failed, r.confinement
        );
    }
    if let Some(g) = &report.git {
        let head = g.head.as_deref().unwrap_or("no commit yet");
        println!("git:     {} at {head}", g.branch);
    }
    println!("ledger:  {} events", report.ledger_entries);
    for line in ui::usage_lines(&usage) {
        println!("usage:   {line}");
    }
    Ok(0)
}

fn decide(
    dir: &Path,
    gate: GateKind,
    hash: &str,
    by: &str,
    decision: GateDecision,
    note: String,
) -> Result<i32> {
    let project = Project::open(dir)?;
    if by.trim().is_empty() {
        bail!("--by needs a name");
    }
    let hash: ContentHash = match hash.parse() {
        Ok(h) => h,
        Err(e) => {
            eprintln!("refused: {e}");
            return Ok(EXIT_USAGE);
        }
    };
    let approval = GateApproval {
        gate,
        hash,
        approver: by.to_string(),
        at: Utc::now(),
        decision,
        note,
    };
    let command = match approval.decision {
        GateDecision::Approve => "consort approve",
        GateDecision::Reject { .. } => "consort reject",
    };
    let _lock = project.lock(command)?;
    match record_gate_decision(&project.ledger_path(), &project.machine()?, approval) {
        Ok(()) => {
            println!("recorded: {gate} gate decision by {by} for {hash}");
            Ok(0)
        }
        Err(consort::actors::ConductorError::Gate(msg)) => {
            eprintln!("{msg}");
            Ok(EXIT_FAILURE)
        }
        Err(e) => Err(e.into()),
    }
}

fn human(dir: &Path, decision: HumanDecision, by: &str) -> Result<i32> {
    let project = Project::open(dir)?;
    let _lock = project.lock(match decision {
        HumanDecision::Retry => "consort retry",
        HumanDecision::Stop => "consort stop",
    })?;
    match record_human_decision(&project.ledger_path(), &project.machine()?, decision, by) {
        Ok(()) if decision == HumanDecision::Stop => {
            println!("recorded: stop by {by}; the run is stopped");
            Ok(0)
        }
        Ok(()) => {
            println!(
                "recorded: retry by {by}; run `consort run --dir {}` to continue",
                dir.display()
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

fn log(dir: &Path, json: bool) -> Result<i32> {
    let project = Project::open(dir)?;
    let path = project.ledger_path();
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let written = if json {
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        out.write_all(text.as_bytes())
    } else {
        let entries = Ledger::<Event>::read(&path)?;
        entries
            .iter()
            .try_for_each(|entry| {
                writeln!(
                    out,
                    "{:>5} {} {:<16} {}{}",
                    entry.seq,
                    entry.time.format("%H:%M:%S%.3f"),
                    entry.event.name(),
                    brief(&entry.event),
                    usage_note(&entry.event)
                )
            })
            .and_then(|()| {
                let totals = consort::actors::usage_totals(entries.iter().map(|e| &e.event));
                ui::usage_lines(&totals)
                    .iter()
                    .try_for_each(|line| writeln!(out, "usage: {line}"))
            })
    };
    match written {
        // The reader stopped reading (`consort log | head`): not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(0),
        other => {
            other.context("writing the log")?;
            Ok(0)
        }
    }
}

/// ` · 1200 tokens (…), 2 call(s), 3.1 s` after an event that records usage.
fn usage_note(e: &Event) -> String {
    match e {
        Event::Produced { usage, .. } | Event::AgentFailed { usage, .. } if !usage.is_zero() => {
            let mut note = format!(" · {}", ui::usage_text(usage));
            if let Some(model) = &usage.model {
                note.push_str(&format!(" ({model})"));
            }
            note
        }
        _ => String::new(),
    }
}

fn brief(e: &Event) -> String {
    match e {
        Event::Start { feature } => format!("{}: {}", feature.id, feature.title),
        Event::Produced {
            assignment,
            author,
            artifact,
            ..
        } => format!("{assignment} {author} → {}", artifact.kind()),
        Event::AgentFailed {
            assignment,
            failure,
            ..
        } => format!("{assignment}: {failure}"),
        Event::Refused { violation, .. } => violation.to_string(),
        Event::Observed { tests, .. } => format!("{} test files", tests.len()),
        Event::Applied { workspace_hash, .. } => format!("work tree {}", workspace_hash.short()),
        Event::ApplyRefused { reason } => reason.to_string(),
        Event::ApplyDenied {
            violation,
            resolved,
        } if resolved.is_empty() => violation.to_string(),
        Event::ApplyDenied {
            violation,
            resolved,
        } => {
            let links: Vec<String> = resolved.iter().map(|(a, b)| format!("{a} → {b}")).collect();
            format!("{violation} (through links: {})", links.join(", "))
        }
        Event::VerifyCompleted { receipt } => format!(
            "{} on {}: {} outcomes, {}",
            receipt.request_id,
            receipt.branch_id,
            receipt.outcomes.len(),
            receipt.exit
        ),
        Event::VerifyFailed { request, error } => format!("{request}: {error}"),
        Event::Gate { approval } => format!(
            "{} {} by {} for {}",
            approval.gate,
            match &approval.decision {
                GateDecision::Approve => "approved".to_string(),
                GateDecision::Reject { reason } => format!("rejected ({reason})"),
            },
            approval.approver,
            approval.hash.short()
        ),
        Event::Promoted { report } => {
            format!("{} applied to {}", report.applied.len(), report.target)
        }
        Event::PromoteFailed { request, error } => format!("{request}: {error}"),
        Event::Human { decision, by } => {
            let decision = match decision {
                HumanDecision::Retry => "retry",
                HumanDecision::Stop => "stop",
            };
            format!("{decision} by {by}")
        }
    }
}

/// How the receipts' runs were confined, counted: `confinement: Landlock ABI 7 (files and TCP) ×24`.
fn confinement_summary(receipts: &[std::sync::Arc<consort::actors::TestRunReceipt>]) -> String {
    let mut counts: std::collections::BTreeMap<String, usize> = std::collections::BTreeMap::new();
    for r in receipts {
        *counts.entry(r.confinement.to_string()).or_default() += 1;
    }
    let parts: Vec<String> = counts
        .iter()
        .map(|(how, n)| format!("{how} ×{n}"))
        .collect();
    if parts.is_empty() {
        "no runs yet".into()
    } else {
        format!("confinement: {}", parts.join(", "))
    }
}

fn verify(dir: &Path) -> Result<i32> {
    let project = Project::open(dir)?;
    let mut ok = true;
    let mut check = |name: &str, result: Result<String, String>| match result {
        Ok(detail) => println!("ok    {name}: {detail}"),
        Err(detail) => {
            ok = false;
            println!("FAIL  {name}: {detail}");
        }
    };
    let chain = Ledger::<Event>::verify(project.ledger_path());
    check(
        "ledger chain",
        chain
            .as_ref()
            .map(|r| format!("{} entries, head {}", r.entries, r.head.short()))
            .map_err(|e| e.to_string()),
    );
    if chain.is_err() {
        return Ok(EXIT_FAILURE);
    }
    let state = project.state()?;
    let work = WorkTree::open(dir)?;
    match &state.frozen {
        Some(frozen) => {
            let on_disk = design_hash_on_disk(&work);
            check(
                "frozen design",
                if on_disk == Some(frozen.hash) {
                    Ok(format!("{} matches the approved hash", frozen.hash.short()))
                } else {
                    Err(format!(
                        "approved {}, on disk {:?}",
                        frozen.hash,
                        on_disk.map(|h| h.to_hex())
                    ))
                },
            );
        }
        None => check("frozen design", Ok("not frozen yet".into())),
    }
    let hashes = work.file_hashes()?;
    let bad: Vec<&String> = state
        .build
        .frozen_tests
        .iter()
        .filter(|(p, h)| hashes.get(*p) != Some(h))
        .map(|(p, _)| p)
        .collect();
    check(
        "frozen tests",
        if bad.is_empty() {
            Ok(format!(
                "{} files unchanged",
                state.build.frozen_tests.len()
            ))
        } else {
            Err(format!("changed or missing: {bad:?}"))
        },
    );
    let events = Ledger::<Event>::read(project.ledger_path())?;
    let issued: std::collections::BTreeSet<_> = {
        let m = project.machine()?;
        let mut s = consort::actors::State::default();
        let mut ids = std::collections::BTreeSet::new();
        for e in &events {
            if let Ok((next, cmds)) = m.step(&s, &e.event) {
                for c in cmds {
                    if let consort::actors::Command::Verify { request, .. } = c {
                        ids.insert(request);
                    }
                }
                s = next;
            }
        }
        ids
    };
    let unissued: Vec<_> = state
        .receipts
        .iter()
        .filter(|r| !issued.contains(&r.request_id) || r.outcomes.is_empty())
        .collect();
    check(
        "receipts",
        if unissued.is_empty() {
            Ok(format!(
                "{} receipts, each answering a request the machine issued; {}",
                state.receipts.len(),
                confinement_summary(&state.receipts)
            ))
        } else {
            Err(format!(
                "{} receipts answer no issued request or report nothing",
                unissued.len()
            ))
        },
    );
    Ok(if ok { 0 } else { EXIT_FAILURE })
}

async fn branches(dir: &Path, sweep: bool) -> Result<i32> {
    let project = Project::open(dir)?;
    let provider = project.provider().await?;
    let list = provider.list("consort-").await?;
    for b in &list {
        println!("{}  ({})", b.name, b.id);
    }
    println!(
        "{} branch(es) with Consort's prefix on {}",
        list.len(),
        provider.kind()
    );
    if sweep {
        let n = provider.sweep(Duration::ZERO).await?;
        println!("swept {n}");
    }
    Ok(0)
}
