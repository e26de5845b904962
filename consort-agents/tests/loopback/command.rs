//! The external-command backend, with real `sh` scripts as agents.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use consort_actors::{
    ActorId, AgentFailure, Artifact, Assignment, ChangeSet, FileChange, ReviewVerdict, Role,
};
use consort_agents::{CommandConfig, CommandError, ExternalCommandAgent, RoleArgs, spawn_role};
use consort_testkit::agents::ask;
use consort_testkit::artifacts::assignment;
use consort_testkit::verify::assert_contains;

/// Writes an executable `sh` script into `dir` and returns its path.
fn script(dir: &Path, name: &str, body: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\nset -eu\n{body}\n")).expect("write script");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    path.display().to_string()
}

/// A fresh directory holding one executable `sh` script `name`; returns the directory (keep it
/// while the script runs) and the script's path.
fn program(name: &str, body: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = script(dir.path(), name, body);
    (dir, path)
}

fn with_files(mut a: Assignment, files: &[(&str, &str)]) -> Assignment {
    a.inputs.files = files
        .iter()
        .map(|(p, c)| (p.to_string(), c.to_string()))
        .collect::<BTreeMap<_, _>>();
    a
}

fn agent(role: Role, program: String, timeout: Duration) -> ExternalCommandAgent {
    ExternalCommandAgent::new(
        role,
        CommandConfig::new(program, Vec::<String>::new()).with_timeout(timeout),
    )
}

#[tokio::test]
async fn edits_in_the_scratch_copy_become_a_change_set() {
    let (_dir, prog) = program(
        "driver.sh",
        r#"
input=$(cat)
case "$input" in *'"test":"T1"'*) ;; *) echo "assignment not on stdin" >&2; exit 3;; esac
printf 'select quantity from stock_records;\n' > src/stock.sql
mkdir -p src/views
printf -- '-- %s by %s\n' "$CONSORT_STEP" "$CONSORT_ROLE" > src/views/new.sql
rm src/gone.sql
"#,
    );
    let a = with_files(
        assignment(1, "green/T1"),
        &[
            ("src/stock.sql", "select 1;\n"),
            ("src/gone.sql", "drop me\n"),
            ("src/same.sql", "unchanged\n"),
        ],
    );
    let args = RoleArgs::new(
        ActorId::new(Role::Driver, "driver-cli"),
        Arc::new(agent(Role::Driver, prog, Duration::from_secs(20))),
    );
    let (actor, _) = spawn_role(args).await.expect("spawn");
    let produced = ask(&actor, a).await.expect("produced");
    assert_eq!(produced.author.name, "driver-cli");
    let Artifact::ChangeSet(ChangeSet { changes, summary }) = produced.artifact else {
        panic!("a change set")
    };
    assert_eq!(summary, "green/T1 by driver.sh");
    assert_eq!(
        changes,
        vec![
            FileChange::Write {
                path: "src/stock.sql".into(),
                content: "select quantity from stock_records;\n".into()
            },
            FileChange::Write {
                path: "src/views/new.sql".into(),
                content: "-- green/T1 by driver\n".into()
            },
            FileChange::Delete {
                path: "src/gone.sql".into()
            },
        ]
    );
}

#[tokio::test]
async fn caches_the_program_leaves_in_the_scratch_copy_are_not_its_answer() {
    let (_dir, prog) = program(
        "driver.sh",
        r#"
cat > /dev/null
printf 'select 2;\n' > src/stock.sql
mkdir -p tests/__pycache__ sub/target/debug .venv/bin web/node_modules/x out/build
printf 'bytecode' > tests/__pycache__/t1.cpython-311.pyc
printf 'obj' > sub/target/debug/app
ln -s /usr/bin/env .venv/bin/python
printf 'js' > web/node_modules/x/index.js
printf 'o' > out/build/a.o
printf 'kept' > src/target
"#,
    );
    let a = with_files(
        assignment(1, "green/T1"),
        &[("src/stock.sql", "select 1;\n")],
    );
    let mut config =
        CommandConfig::new(prog, Vec::<String>::new()).with_timeout(Duration::from_secs(20));
    config.caches = vec!["build".into()];
    let out = ExternalCommandAgent::new(Role::Driver, config)
        .run(&a)
        .await
        .expect("a change set");
    let Artifact::ChangeSet(ChangeSet { changes, .. }) = out.artifact else {
        panic!("a change set")
    };
    let paths: Vec<&str> = changes.iter().map(FileChange::path).collect();
    assert_eq!(
        paths,
        vec!["src/stock.sql", "src/target"],
        "nothing from a cache, at any depth; a file named like one is kept"
    );
}

#[tokio::test]
async fn an_artifact_on_stdout_is_the_answer() {
    let (_dir, prog) = program(
        "reviewer.sh",
        r#"
cat > /dev/null
test -f src/stock.sql
echo 'looking at the code...' >&2
echo '{"kind": "review-verdict", "body": {"decision": "changes-requested", "reasons": ["name the query"]}}'
"#,
    );
    let a = with_files(
        assignment(2, "review/T1/0"),
        &[("src/stock.sql", "select 1;\n")],
    );
    let out = agent(Role::Navigator, prog, Duration::from_secs(20))
        .run(&a)
        .await
        .expect("verdict");
    assert_eq!(
        out.artifact,
        Artifact::ReviewVerdict(ReviewVerdict::ChangesRequested {
            reasons: vec!["name the query".into()]
        })
    );
    assert_eq!(out.usage.calls, 1);
}

#[tokio::test]
async fn a_symlink_out_of_the_scratch_copy_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = dir.path().join("outside.sql");
    std::fs::write(&outside, "secret\n").expect("write");
    let prog = script(
        dir.path(),
        "escape.sh",
        &format!(
            "cat > /dev/null\nln -s '{}' src/evil.sql\necho changed >> src/evil.sql",
            outside.display()
        ),
    );
    let a = with_files(assignment(3, "green/T1"), &[("src/a.sql", "a\n")]);
    let agent = agent(Role::Driver, prog, Duration::from_secs(20));
    match agent.run(&a).await {
        Err(CommandError::PathEscape { path, reason }) => {
            assert_eq!(path, "src/evil.sql");
            assert_contains(&reason, "symbolic link");
        }
        other => panic!("expected PathEscape, got {other:?}"),
    }
    // Through the Agent trait the same refusal is a CommandFailed the conductor can log.
    match consort_agents::Agent::act(&agent, &a).await {
        Err(AgentFailure::CommandFailed { detail }) => {
            assert!(detail.contains("escapes the scratch copy"), "{detail}")
        }
        other => panic!("expected CommandFailed, got {other:?}"),
    }
}

#[tokio::test]
async fn absolute_and_parent_paths_on_stdout_are_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (name, path) in [
        ("abs.sh", "/etc/consort-evil.sql"),
        ("up.sh", "../evil.sql"),
    ] {
        let prog = script(
            dir.path(),
            name,
            &format!(
                r#"cat > /dev/null
echo '{{"kind": "change-set", "body": {{"changes": [{{"op": "write", "path": "{path}", "content": "x"}}]}}}}'"#
            ),
        );
        match agent(Role::Driver, prog, Duration::from_secs(20))
            .run(&assignment(4, "green/T1"))
            .await
        {
            Err(CommandError::PathEscape { path: p, .. }) => assert_eq!(p, path),
            other => panic!("{path}: expected PathEscape, got {other:?}"),
        }
    }
}

#[tokio::test]
async fn the_time_limit_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pidfile = dir.path().join("child.pid");
    let prog = script(
        dir.path(),
        "slow.sh",
        &format!(
            "cat > /dev/null\nsleep 30 &\necho $! > '{}'\nwait",
            pidfile.display()
        ),
    );
    let err = agent(Role::Driver, prog.clone(), Duration::from_millis(500))
        .run(&assignment(5, "green/T1"))
        .await
        .expect_err("too slow");
    assert!(
        matches!(err, CommandError::Timeout { limit_ms: 500, .. }),
        "{err:?}"
    );
    assert_eq!(err.to_failure(), AgentFailure::Timeout { secs: 1 });
    let pid: i32 = std::fs::read_to_string(&pidfile)
        .expect("the script recorded its child")
        .trim()
        .parse()
        .expect("pid");
    // The background child was in the program's process group and got SIGKILL: it is gone,
    // or a zombie waiting to be reaped, never still sleeping.
    let mut state = String::new();
    for _ in 0..100 {
        state = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .split_whitespace()
                    .next()
                    .unwrap_or("")
                    .to_string()
            })
            .unwrap_or_else(|_| "gone".into());
        if state == "gone" || state == "Z" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(state == "gone" || state == "Z", "child state {state}");

    // Through a role actor, the command's limit is a Timeout failure.
    let args = RoleArgs::new(
        ActorId::new(Role::Driver, "driver"),
        Arc::new(agent(Role::Driver, prog, Duration::from_millis(300))),
    );
    let (actor, _) = spawn_role(args).await.expect("spawn");
    let reply = ask(&actor, assignment(6, "green/T1")).await;
    assert_eq!(reply, Err(AgentFailure::Timeout { secs: 1 }));
}

#[tokio::test]
async fn only_allowed_environment_variables_reach_the_program() {
    // A variable this process has and the allow-list does not name.
    let (hidden, _) = std::env::vars()
        .find(|(k, v)| {
            ![
                "PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", "PWD", "SHLVL", "_",
            ]
            .contains(&k.as_str())
                && !k.starts_with("CONSORT_")
                && !v.is_empty()
        })
        .expect("the test process has some environment");
    let (_dir, prog) = program("env.sh", "cat > /dev/null\nenv | sort > env.txt");
    let mut cfg = CommandConfig::new(prog, Vec::<String>::new());
    cfg.pass_env = vec!["PATH".into()];
    cfg.env_set.insert("AGENT_MODE".into(), "strict".into());
    let out = ExternalCommandAgent::new(Role::Driver, cfg)
        .run(&assignment(7, "green/T1"))
        .await
        .expect("ran");
    let Artifact::ChangeSet(cs) = out.artifact else {
        panic!("change set")
    };
    let Some(FileChange::Write { content, .. }) = cs.changes.first() else {
        panic!("env.txt written: {cs:?}")
    };
    let names: Vec<&str> = content
        .lines()
        .filter_map(|l| l.split('=').next())
        .collect();
    assert!(names.contains(&"PATH"), "{content}");
    assert_contains(content, "AGENT_MODE=strict");
    assert_contains(content, "CONSORT_STEP=green/T1");
    assert_contains(content, "CONSORT_ANSWER_WITH=change-set");
    assert!(
        !names.contains(&hidden.as_str()),
        "{hidden} leaked: {content}"
    );
    assert!(!names.contains(&"HOME"), "{content}");
}

#[tokio::test]
async fn failures_output_caps_and_bad_inputs_are_typed_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let failing = script(
        dir.path(),
        "fail.sh",
        "cat > /dev/null\necho 'model quota exhausted' >&2\nexit 7",
    );
    match agent(Role::Driver, failing, Duration::from_secs(20))
        .run(&assignment(8, "green/T1"))
        .await
    {
        Err(CommandError::Exit { status, stderr, .. }) => {
            assert_eq!(status, "exit code 7");
            assert_eq!(stderr, "model quota exhausted");
        }
        other => panic!("expected Exit, got {other:?}"),
    }

    let noisy = script(
        dir.path(),
        "noisy.sh",
        "cat > /dev/null\nyes consort | head -c 100000",
    );
    let mut cfg = CommandConfig::new(noisy, Vec::<String>::new());
    cfg.output_cap_bytes = 1000;
    match ExternalCommandAgent::new(Role::Driver, cfg)
        .run(&assignment(9, "green/T1"))
        .await
    {
        Err(CommandError::OutputTooLarge { cap, .. }) => assert_eq!(cap, 1000),
        other => panic!("expected OutputTooLarge, got {other:?}"),
    }

    let quiet = script(dir.path(), "quiet.sh", "cat > /dev/null");
    let a = with_files(assignment(10, "green/T1"), &[("../escape.sql", "x")]);
    assert!(matches!(
        agent(Role::Driver, quiet.clone(), Duration::from_secs(20))
            .run(&a)
            .await,
        Err(CommandError::InputPath { .. })
    ));
    // A non-change-set step needs an artifact on stdout.
    match agent(Role::Navigator, quiet, Duration::from_secs(20))
        .run(&assignment(11, "review/T1/0"))
        .await
    {
        Err(CommandError::BadOutput { detail, .. }) => {
            assert!(detail.contains("empty"), "{detail}")
        }
        other => panic!("expected BadOutput, got {other:?}"),
    }
    match agent(
        Role::Driver,
        "/nonexistent/consort-agent".into(),
        Duration::from_secs(5),
    )
    .run(&assignment(12, "green/T1"))
    .await
    {
        Err(CommandError::Spawn { program, .. }) => {
            assert_eq!(program, "/nonexistent/consort-agent")
        }
        other => panic!("expected Spawn, got {other:?}"),
    }
}
