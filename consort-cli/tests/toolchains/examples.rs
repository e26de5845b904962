//! The command line's examples run as a newcomer runs them: `pyservice` (a Python service tested
//! by pytest through psycopg; needs python3 with pytest and psycopg, which `.ci/run` installs)
//! and `stockflow` on a terminal.

use std::process::{Command, Stdio};

use crate::common::ledger_text;
use consort_testkit::process::{built_example, text};

#[test]
fn the_python_service_example_runs_to_done_with_per_test_results_and_commits() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("items");
    // A newcomer's PATH right after cloning: no `consort` installed.
    let path = std::env::var_os("PATH").unwrap_or_default();
    let without_consort =
        std::env::join_paths(std::env::split_paths(&path).filter(|d| !d.join("consort").exists()))
            .expect("PATH");
    let out = Command::new(built_example("pyservice"))
        .arg("--dir")
        .arg(&dir)
        .env("PATH", without_consort)
        .stdin(Stdio::null())
        .output()
        .expect("the example starts");
    let said = text(&out);
    assert!(out.status.success(), "{said}");
    // The summary's command works as printed: through cargo while nothing is installed (run
    // here as the binary cargo would run, since this test runs inside cargo).
    let verify = said
        .lines()
        .skip_while(|l| !l.starts_with("check it yourself:"))
        .nth(1)
        .map(str::trim)
        .expect("the summary names a command");
    assert_eq!(
        verify,
        format!(
            "cargo run -q --bin consort -- verify --dir {}",
            dir.display()
        )
    );
    let args = verify.trim_start_matches("cargo run -q --bin consort -- ");
    let checked = Command::new(env!("CARGO_BIN_EXE_consort"))
        .args(args.split(' '))
        .output()
        .expect("consort verify");
    assert!(checked.status.success(), "{}", text(&checked));
    assert!(
        said.contains("every test green, every gate approved"),
        "{said}"
    );
    assert!(said.contains("2 of 2 green"), "{said}");
    let items = std::fs::read_to_string(dir.join("app/items.py")).expect("the service");
    assert!(items.contains("def item_total"), "{items}");
    let ledger = ledger_text(&dir);
    assert!(
        ledger.contains("tests.test_t1_add_item::test_add_item_stores_exactly_that_item"),
        "the JUnit report names each test"
    );
    let log = Command::new("git")
        .arg("-C")
        .arg(&dir)
        .args(["log", "--format=%s"])
        .output()
        .expect("git log");
    let log = String::from_utf8_lossy(&log.stdout);
    assert_eq!(log.matches("RED T").count(), 2, "{log}");
    assert_eq!(log.matches("GREEN T").count(), 2, "{log}");
}

/// The StockFlow example on a terminal (a pseudo-terminal from util-linux's `script`): each
/// gate's prompt stands alone while it waits — the spinner is neither drawn over it nor ticks
/// beside it — and at the design gate it says where the frozen design is and shows it on `s`.
#[test]
fn the_gate_prompt_on_a_terminal_is_never_drawn_over_and_shows_the_design() {
    use std::io::{Read, Write};
    use std::sync::{Arc, Mutex};
    use std::time::{Duration, Instant};

    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("sf");
    let command = format!(
        "{} --dir {}",
        built_example("stockflow").display(),
        dir.display()
    );
    let mut child = Command::new("script")
        .args(["-qfec", &command, "/dev/null"])
        .env("USER", "ada")
        .env("TERM", "xterm-256color")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("script (util-linux) starts");
    let seen = Arc::new(Mutex::new(Vec::<u8>::new()));
    let mut stdout = child.stdout.take().expect("stdout");
    let sink = Arc::clone(&seen);
    let reader = std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = stdout.read(&mut buf) {
            if n == 0 {
                break;
            }
            sink.lock().expect("buffer").extend_from_slice(&buf[..n]);
        }
    });
    let text = || String::from_utf8_lossy(&seen.lock().expect("buffer")).into_owned();
    let mut stdin = child.stdin.take().expect("stdin");
    // Waits for the `n`th occurrence of `prompt`, lets a spinner (if any) tick for a second,
    // then answers.
    let mut answer = |prompt: &str, n: usize, reply: &str| {
        let start = Instant::now();
        while text().matches(prompt).count() < n {
            assert!(
                start.elapsed() < Duration::from_secs(120),
                "no prompt {prompt:?}: {}",
                text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        std::thread::sleep(Duration::from_secs(1));
        stdin.write_all(reply.as_bytes()).expect("answer");
    };
    let design = "Approve as ada? [y]es, [n]o, [s]how the design: ";
    answer(design, 1, "s\n");
    answer(design, 2, "y\n");
    let other = "Approve as ada? [y]es, [n]o: ";
    answer(other, 1, "y\n");
    answer(other, 2, "y\n");
    let status = child.wait().expect("wait");
    reader.join().expect("reader");
    let said = text();
    assert!(status.success(), "{said}");
    assert!(said.contains("outcome:   done"), "{said}");
    assert!(
        said.contains(&format!(
            "the design is frozen in {}",
            dir.join(".consort/features/F1-warehouse-stock/design.json")
                .display()
        )),
        "{said}"
    );
    assert!(
        said.contains("Tests, in build order"),
        "the design is shown: {said}"
    );
    // What follows each prompt up to the end of its line is the typed answer alone.
    for prompt in [design, other] {
        for (at, _) in said.match_indices(prompt) {
            let rest = &said[at + prompt.len()..];
            let line = &rest[..rest.find('\n').unwrap_or(rest.len())];
            assert!(
                matches!(line.trim_end_matches(['\r', '\n']), "s" | "y"),
                "the prompt was drawn over while it waited: {line:?}"
            );
        }
    }
}

/// The shell words of `s`, quoted.
fn quoted(s: &std::ffi::OsStr) -> String {
    format!("'{}'", s.to_string_lossy().replace('\'', "'\\''"))
}

/// Runs the StockFlow example in `project` as an unprivileged user whose home is `home`, with
/// the system's PostgreSQL hidden: in a mount namespace of its own, an empty directory lies
/// over `/usr/lib/postgresql` and nothing (`/dev/null`) over every `initdb`, `postgres`,
/// `pg_ctl`, `pg_config` and `psql` on `PATH`. As root the run drops to `nobody`; otherwise a
/// user namespace grants the mounts and maps the user back.
fn stockflow_without_postgres(home: &std::path::Path, project: &str) -> std::process::Output {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let root = nix::unistd::geteuid().is_root();
    let run = format!(
        "env -i HOME={home} PATH={path} LANG=C.UTF-8 {exe} --dir {dir} --approve-as newcomer",
        home = quoted(home.as_os_str()),
        path = quoted(&path),
        exe = quoted(built_example("stockflow").as_os_str()),
        dir = quoted(home.join(project).as_os_str()),
    );
    let drop = if root {
        "setpriv --reuid=65534 --regid=65534 --clear-groups".to_string()
    } else {
        let (uid, gid) = (nix::unistd::getuid(), nix::unistd::getgid());
        format!("unshare --user --map-user={uid} --map-group={gid}")
    };
    let script = format!(
        "set -e\n\
         if [ -d /usr/lib/postgresql ]; then mount -t tmpfs none /usr/lib/postgresql; fi\n\
         IFS=:; for d in $PATH; do for n in initdb postgres pg_ctl pg_config psql; do\n\
           if [ -e \"$d/$n\" ]; then mount --bind /dev/null \"$d/$n\"; fi\n\
         done; done; unset IFS\n\
         exec {drop} {run}\n"
    );
    let mut cmd = Command::new("unshare");
    if !root {
        cmd.args(["--user", "--map-root-user"]);
    }
    cmd.args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("unshare (util-linux) starts")
}

/// The README's first command as on a machine without PostgreSQL: an unprivileged user, the
/// system's server hidden. The first run fetches Consort's own PostgreSQL into the user's
/// cache (saying so) and reaches done; a second project reuses it without fetching.
#[test]
fn the_stockflow_example_reaches_done_without_an_installed_postgres_fetching_it_once() {
    let home = tempfile::tempdir().expect("home");
    std::fs::set_permissions(
        home.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    if nix::unistd::geteuid().is_root() {
        let nobody = Some(nix::unistd::Uid::from_raw(65534));
        nix::unistd::chown(home.path(), nobody, Some(nix::unistd::Gid::from_raw(65534)))
            .expect("chown the home to nobody");
    }
    let first = stockflow_without_postgres(home.path(), "sf1");
    let said = text(&first);
    assert!(first.status.success(), "{said}");
    assert!(said.contains("fetching PostgreSQL 18.6"), "{said}");
    assert!(
        said.contains("every test green, every gate approved"),
        "{said}"
    );
    let cache = home.path().join(".cache/consort/postgresql");
    let copies: Vec<_> = std::fs::read_dir(&cache)
        .expect("the user's cache")
        .map(|e| e.expect("entry").file_name())
        .filter(|n| n != ".lock")
        .collect();
    assert_eq!(copies.len(), 1, "{copies:?}");

    let second = stockflow_without_postgres(home.path(), "sf2");
    let said = text(&second);
    assert!(second.status.success(), "{said}");
    assert!(
        !said.contains("fetching PostgreSQL"),
        "reused, not fetched: {said}"
    );
    assert!(
        said.contains("every test green, every gate approved"),
        "{said}"
    );
}
