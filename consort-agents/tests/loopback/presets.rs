//! The coding-agent CLI presets, with stand-in programs that follow each CLI's documented
//! interface: `claude -p <prompt> --output-format json` (one JSON object with `result`),
//! `codex exec --json … <prompt>` (JSON Lines events), `aider --message <prompt> … <files>`
//! (plain text). Each stand-in is a `sh` script named like the CLI in a directory of its own,
//! found through the `PATH` the test sets for the program (`env_set`), never through this
//! process's environment. It records its argv, prompt, stdin and environment in a log
//! directory outside the scratch copy, edits files in its working directory and prints what
//! the real CLI prints.

use std::path::{Path, PathBuf};
use std::time::Duration;

use consort_actors::{Artifact, Assignment, ChangeSet, FileChange, ReviewVerdict, Role, Usage};
use consort_agents::prompts::role_prompt;
use consort_agents::{
    AgentOutput, CommandConfig, CommandError, ExternalCommandAgent, Preset, cli_prompt,
};
use consort_testkit::artifacts::{assignment, with_files};

/// A stand-in CLI: a directory holding the executable `name`, and a log directory.
struct StandIn {
    bin: tempfile::TempDir,
    log: tempfile::TempDir,
}

impl StandIn {
    fn new(name: &str, body: &str) -> StandIn {
        use std::os::unix::fs::PermissionsExt;
        let bin = tempfile::tempdir().expect("tempdir");
        let log = tempfile::tempdir().expect("tempdir");
        let path = bin.path().join(name);
        let prelude = "#!/bin/sh\nset -eu\nL=\"$STANDIN_LOG\"\n\
                       for a in \"$@\"; do printf '%s\\n--\\n' \"$a\"; done > \"$L/argv\"\n\
                       cat > \"$L/stdin\"\nenv | sort > \"$L/env\"\n\
                       say() { printf '%s\\n' \"$1\"; }\n";
        std::fs::write(&path, format!("{prelude}{body}\n")).expect("write stand-in");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        StandIn { bin, log }
    }

    /// A configuration for `preset` that finds this stand-in on the program's `PATH` and
    /// keeps transcripts in `transcripts`.
    fn config(&self, preset: Preset, transcripts: &Path) -> CommandConfig {
        let mut cfg = CommandConfig::preset(preset).with_timeout(Duration::from_secs(20));
        cfg.env_set.insert(
            "PATH".into(),
            format!("{}:/usr/bin:/bin", self.bin.path().display()),
        );
        cfg.env_set
            .insert("STANDIN_LOG".into(), self.log.path().display().to_string());
        cfg.transcript_dir = Some(transcripts.to_path_buf());
        cfg
    }

    /// The arguments the stand-in received.
    fn argv(&self) -> Vec<String> {
        let text = self.read("argv");
        let mut args: Vec<String> = text.split("\n--\n").map(str::to_string).collect();
        args.pop(); // after the last separator
        args
    }

    /// Runs [`green`] as the Driver through `preset` with `args` as the configuration's own;
    /// the assignment, the change set answered, the argv and the transcripts' directory.
    async fn drive_green(
        &self,
        preset: Preset,
        args: &[&str],
    ) -> (Assignment, AgentOutput, Vec<String>, tempfile::TempDir) {
        let transcripts = tempfile::tempdir().expect("tempdir");
        let mut cfg = self.config(preset, transcripts.path());
        cfg.args = args.iter().map(|a| a.to_string()).collect();
        let a = green();
        let out = ExternalCommandAgent::new(Role::Driver, cfg)
            .run(&a)
            .await
            .expect("a change set");
        (a, out, self.argv(), transcripts)
    }

    fn read(&self, name: &str) -> String {
        std::fs::read_to_string(self.log.path().join(name)).expect("the stand-in logged")
    }
}

fn green() -> Assignment {
    let mut a = with_files(
        assignment(1, "green/T1"),
        &[
            ("src/stock.sql", "select 1; -- the old query\n"),
            ("src/gone.sql", "drop me\n"),
        ],
    );
    a.feedback = vec!["the count is off by one".into()];
    a
}

fn review() -> Assignment {
    with_files(
        assignment(2, "review/T1/0"),
        &[("src/stock.sql", "select quantity from stock_records;\n")],
    )
}

/// The change the stand-ins make for `green()`.
fn expected_changes() -> Vec<FileChange> {
    vec![
        FileChange::Write {
            path: "src/stock.sql".into(),
            content: "select quantity from stock_records;\n".into(),
        },
        FileChange::Delete {
            path: "src/gone.sql".into(),
        },
    ]
}

/// Edits the stand-ins make in their working directory (the scratch copy).
const EDIT: &str = "test -f src/gone.sql\n\
                    printf 'select quantity from stock_records;\\n' > src/stock.sql\n\
                    rm src/gone.sql";

/// The prompt a CLI gets holds the role's prompt, the step and the assignment, not the files'
/// contents (they are in its working directory).
fn assert_prompt(prompt: &str, a: &Assignment) {
    assert_eq!(prompt, cli_prompt(a));
    assert!(
        prompt.starts_with(role_prompt(a.role).trim_end()),
        "{prompt}"
    );
    assert!(prompt.contains(&format!("`{}`", a.step)), "{prompt}");
    assert!(prompt.contains("\"src/stock.sql\""), "{prompt}");
    assert!(
        !prompt.contains("the old query"),
        "file contents are not repeated"
    );
    for f in &a.feedback {
        assert!(prompt.contains(f.as_str()), "feedback in the prompt");
    }
}

/// The change set `artifact` is.
fn change_set(artifact: Artifact) -> ChangeSet {
    let Artifact::ChangeSet(cs) = artifact else {
        panic!("a change set")
    };
    cs
}

/// The prompt and completion tokens of `usage`.
fn tokens(usage: &Usage) -> (u64, u64) {
    (usage.prompt_tokens, usage.completion_tokens)
}

/// The words of `text`, split at runs of white space: an argv as one line.
fn words(text: &str) -> Vec<&str> {
    text.split_whitespace().collect()
}

fn transcript(dir: &Path, name: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

#[tokio::test]
async fn claude_code_edits_the_scratch_copy_and_its_diff_is_the_change_set() {
    let cli = StandIn::new(
        "claude",
        &format!(
            "[ \"$1\" = -p ] || {{ echo 'usage: claude -p <prompt>' >&2; exit 2; }}\n\
             printf '%s' \"$2\" > \"$L/prompt\"\n\
             [ \"$3 $4\" = '--output-format json' ] || exit 2\n\
             echo 'claude: 3 tool uses' >&2\n{EDIT}\n\
             say '{{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\
             \"result\":\"I changed src/stock.sql and removed src/gone.sql.\",\
             \"session_id\":\"s1\",\"total_cost_usd\":0.02,\
             \"usage\":{{\"input_tokens\":1200,\"cache_read_input_tokens\":300,\"output_tokens\":80}}}}'"
        ),
    );
    let (a, out, argv, transcripts) = cli
        .drive_green(Preset::ClaudeCode, &["--model", "sonnet"])
        .await;
    assert_eq!(argv[0], "-p");
    assert_eq!(
        argv[2..],
        words("--output-format json --permission-mode acceptEdits --model sonnet")
    );
    assert_prompt(&cli.read("prompt"), &a);
    assert!(cli.read("prompt").contains("Answer by editing files"));
    assert_eq!(
        cli.read("stdin"),
        "",
        "a CLI gets the prompt, nothing on stdin"
    );
    assert_eq!(tokens(&out.usage), (1500, 80));
    let ChangeSet { changes, summary } = change_set(out.artifact);
    assert_eq!(changes, expected_changes());
    assert_eq!(summary, "green/T1 by claude");
    let t = transcript(transcripts.path(), "green_T1-0.txt");
    assert!(t.contains("outcome: exit code 0\n"), "{t}");
    assert!(
        t.contains("claude: 3 tool uses"),
        "stderr kept on success: {t}"
    );
    assert!(t.contains("args: -p {prompt} --output-format json"), "{t}");
    assert!(t.contains("--- prompt ("), "{t}");
}

#[tokio::test]
async fn claude_code_answers_a_json_step_in_its_result_and_its_errors_are_typed() {
    let cli = StandIn::new(
        "claude",
        "printf '%s' \"$2\" > \"$L/prompt\"\n\
         case \"$2\" in *'\"kind\": \"review-verdict\"'*) ;; *) exit 3;; esac\n\
         if [ -e \"$L/fail\" ]; then\n\
           say '{\"type\":\"result\",\"subtype\":\"error_max_turns\",\"is_error\":true,\"result\":\"\"}'\n\
           exit \"$(cat \"$L/fail\")\"\n\
         fi\n\
         say '{\"type\":\"result\",\"subtype\":\"success\",\"is_error\":false,\
         \"result\":\"Here is my verdict:\\n```json\\n{\\\"kind\\\": \\\"review-verdict\\\", \
         \\\"body\\\": {\\\"decision\\\": \\\"approve\\\", \\\"notes\\\": [\\\"clear\\\"]}}\\n```\"}'",
    );
    let transcripts = tempfile::tempdir().expect("tempdir");
    let agent = ExternalCommandAgent::new(
        Role::Navigator,
        cli.config(Preset::ClaudeCode, transcripts.path()),
    );
    let a = review();
    let out = agent.run(&a).await.expect("a verdict");
    assert_eq!(
        out.artifact,
        Artifact::ReviewVerdict(ReviewVerdict::Approve {
            notes: vec!["clear".into()]
        })
    );
    let prompt = cli.read("prompt");
    assert_prompt(&prompt, &a);
    assert!(prompt.contains("Do not change any file"), "{prompt}");

    // An error result is the failure, whether the CLI exits 0 or 1 with it.
    for code in ["0", "1"] {
        std::fs::write(cli.log.path().join("fail"), code).expect("arm");
        match agent.run(&a).await {
            Err(CommandError::Reported { detail, .. }) => {
                assert!(detail.contains("error_max_turns"), "{detail}")
            }
            other => panic!("exit {code}: expected Reported, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn codex_runs_exec_json_and_its_last_agent_message_is_read() {
    let cli = StandIn::new(
        "codex",
        &format!(
            "[ \"$1 $2\" = 'exec --json' ] || {{ echo 'usage: codex exec --json <prompt>' >&2; exit 2; }}\n\
             for last in \"$@\"; do :; done\n\
             printf '%s' \"$last\" > \"$L/prompt\"\n\
             echo 'codex: reading files' >&2\n\
             say '{{\"type\":\"thread.started\",\"thread_id\":\"t1\"}}'\n\
             say '{{\"type\":\"turn.started\"}}'\n\
             case \"$last\" in\n\
             *'\"kind\": \"review-verdict\"'*)\n\
               say '{{\"type\":\"item.completed\",\"item\":{{\"id\":\"i1\",\"type\":\"agent_message\",\
             \"text\":\"{{\\\"kind\\\": \\\"review-verdict\\\", \\\"body\\\": {{\\\"decision\\\": \
             \\\"changes-requested\\\", \\\"reasons\\\": [\\\"name the query\\\"]}}}}\"}}}}' ;;\n\
             *)\n{EDIT}\n\
               say '{{\"type\":\"item.completed\",\"item\":{{\"id\":\"i2\",\"type\":\"file_change\",\"status\":\"completed\"}}}}'\n\
               say '{{\"type\":\"item.completed\",\"item\":{{\"id\":\"i3\",\"type\":\"agent_message\",\"text\":\"Done.\"}}}}' ;;\n\
             esac\n\
             say '{{\"type\":\"turn.completed\",\"usage\":{{\"input_tokens\":900,\"cached_input_tokens\":100,\"output_tokens\":40}}}}'"
        ),
    );
    let (a, out, argv, transcripts) = cli.drive_green(Preset::Codex, &[]).await;
    assert_eq!(
        argv[..5],
        words("exec --json --skip-git-repo-check --sandbox workspace-write")
    );
    assert_eq!(argv.len(), 6, "the prompt is the last argument: {argv:?}");
    assert_prompt(&argv[5], &a);
    assert_eq!(change_set(out.artifact).changes, expected_changes());
    assert_eq!(tokens(&out.usage), (900, 40));
    let t = transcript(transcripts.path(), "green_T1-0.txt");
    assert!(t.contains("codex: reading files"), "{t}");
    assert!(
        t.contains("\"type\":\"turn.completed\""),
        "stdout kept: {t}"
    );

    let navigator = ExternalCommandAgent::new(
        Role::Navigator,
        cli.config(Preset::Codex, transcripts.path()),
    );
    let out = navigator.run(&review()).await.expect("a verdict");
    assert_eq!(
        out.artifact,
        Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested {
            reasons: vec!["name the query".into()]
        })
    );
    assert!(transcripts.path().join("review_T1_0-0.txt").is_file());
}

#[tokio::test]
async fn aider_gets_the_message_and_the_files_and_edits_them() {
    let cli = StandIn::new(
        "aider",
        &format!(
            "[ \"$1\" = --message ] || {{ echo 'usage: aider --message <text> [files]' >&2; exit 2; }}\n\
             printf '%s' \"$2\" > \"$L/prompt\"\n\
             echo 'Aider v0.86.1'\n\
             echo 'Model: openai/local with diff edit format'\n\
             {EDIT}\n\
             echo 'Applied edit to src/stock.sql'"
        ),
    );
    let (a, out, argv, transcripts) = cli
        .drive_green(Preset::Aider, &["--model", "openai/local"])
        .await;
    assert_eq!(argv[0], "--message");
    assert_prompt(&argv[1], &a);
    assert_eq!(
        argv[2..],
        words(
            "--yes-always --no-git --no-pretty --no-stream --no-check-update --no-analytics \
             --chat-history-file /dev/null --input-history-file /dev/null \
             --model openai/local src/gone.sql src/stock.sql"
        ),
        "the step's files are added to the chat"
    );
    assert_eq!(change_set(out.artifact).changes, expected_changes());
    let t = transcript(transcripts.path(), "green_T1-0.txt");
    assert!(t.contains("Applied edit to src/stock.sql"), "{t}");
}

#[tokio::test]
async fn a_hanging_cli_is_killed_at_its_time_limit_and_its_stderr_is_kept() {
    let cli = StandIn::new("claude", "echo 'claude: waiting for a model' >&2\nsleep 30");
    let transcripts = tempfile::tempdir().expect("tempdir");
    let cfg = cli
        .config(Preset::ClaudeCode, transcripts.path())
        .with_timeout(Duration::from_millis(700));
    let err = ExternalCommandAgent::new(Role::Driver, cfg)
        .run(&green())
        .await
        .expect_err("too slow");
    assert!(
        matches!(err, CommandError::Timeout { limit_ms: 700, .. }),
        "{err:?}"
    );
    let t = transcript(transcripts.path(), "green_T1-0.txt");
    assert!(t.contains("ran past its time limit of 700 ms"), "{t}");
    assert!(t.contains("claude: waiting for a model"), "{t}");
}

#[tokio::test]
async fn only_pass_env_and_env_set_reach_a_cli() {
    // A variable this process has that the configuration does not name.
    let (hidden, _) = std::env::vars()
        .find(|(k, v)| {
            !["PATH", "HOME", "PWD", "SHLVL", "_"].contains(&k.as_str())
                && !k.starts_with("CONSORT_")
                && !v.is_empty()
        })
        .expect("the test process has some environment");
    let cli = StandIn::new("codex", "say '{\"type\":\"turn.started\"}'");
    let transcripts = tempfile::tempdir().expect("tempdir");
    let mut cfg = cli.config(Preset::Codex, transcripts.path());
    cfg.pass_env = vec!["HOME".into()];
    cfg.env_set
        .insert("OPENAI_BASE_URL".into(), "http://127.0.0.1:9/v1".into());
    ExternalCommandAgent::new(Role::Driver, cfg)
        .run(&green())
        .await
        .expect("an empty change set");
    let env = cli.read("env");
    let names: Vec<&str> = env.lines().filter_map(|l| l.split('=').next()).collect();
    assert!(!names.contains(&hidden.as_str()), "{hidden} leaked: {env}");
    assert!(
        env.contains("OPENAI_BASE_URL=http://127.0.0.1:9/v1"),
        "{env}"
    );
    assert!(env.contains("CONSORT_ROLE=driver"), "{env}");
    assert_eq!(
        names.contains(&"HOME"),
        std::env::var_os("HOME").is_some(),
        "{env}"
    );
    for absent in ["LANG", "TMPDIR", "LC_ALL"] {
        assert!(!names.contains(&absent), "{absent} not in pass_env: {env}");
    }
}

#[tokio::test]
async fn a_plain_command_gets_the_role_prompt_and_keeps_a_transcript() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = dir.path().join("agent.sh");
    std::fs::write(
        &prog,
        format!(
            "#!/bin/sh\nset -eu\ncat > '{}'\necho 'plain: done' >&2\nprintf 'x\\n' > src/new.sql\n",
            dir.path().join("stdin.json").display()
        ),
    )
    .expect("write");
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let transcripts = tempfile::tempdir().expect("tempdir");
    let mut cfg = CommandConfig::new(prog.display().to_string(), Vec::<String>::new());
    cfg.transcript_dir = Some(transcripts.path().to_path_buf());
    let a = green();
    ExternalCommandAgent::new(Role::Driver, cfg)
        .run(&a)
        .await
        .expect("a change set");
    let input: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("stdin.json")).expect("stdin kept"),
    )
    .expect("JSON on stdin");
    assert_eq!(input["step_key"], "green/T1");
    assert_eq!(input["answer_with"], "change-set");
    assert_eq!(
        input["role_prompt"],
        consort_agents::prompts::system_prompt(Role::Driver)
    );
    assert_eq!(input["prompt"], cli_prompt(&a));
    assert_eq!(
        input["inputs"]["files"]["src/gone.sql"], "drop me\n",
        "the assignment's fields are all there"
    );
    let t = transcript(transcripts.path(), "green_T1-0.txt");
    assert!(t.contains("plain: done"), "{t}");
    assert!(
        !t.contains("--- prompt"),
        "no argument carries the prompt: {t}"
    );
}
