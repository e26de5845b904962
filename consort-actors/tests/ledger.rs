//! Ledger tests: durability, tamper evidence, crash recovery, locking, hostile input.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use consort_actors::AppendObserver;
use consort_actors::ContentHash;
use consort_actors::canonical_json;
use consort_actors::{GENESIS_HEX, Ledger, LedgerError, LedgerOptions, genesis};
use consort_testkit::observers::AbortAfter;
use proptest::prelude::*;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
enum Ev {
    Started { run: String },
    Step { key: String, n: u32 },
    Note { text: String },
}

fn step(n: u32) -> Ev {
    Ev::Step {
        key: format!("red/T{n}"),
        n,
    }
}

fn ledger_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join(".consort").join("ledger.jsonl")
}

/// A ledger with `n` step events, returned with its path.
fn filled(n: u32) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = ledger_path(&dir);
    let mut ledger = Ledger::<Ev>::open(&path).expect("open");
    for i in 1..=n {
        ledger.append(&step(i)).expect("append");
    }
    (dir, path)
}

fn lines(path: &Path) -> Vec<String> {
    fs::read_to_string(path)
        .expect("read")
        .lines()
        .map(str::to_string)
        .collect()
}

fn write_lines(path: &Path, lines: &[String]) {
    let mut text = lines.join("\n");
    text.push('\n');
    fs::write(path, text).expect("write");
}

/// Applies `edit` to the file's lines and writes them back.
fn edit_lines(path: &Path, edit: impl FnOnce(&mut Vec<String>)) {
    let mut all = lines(path);
    edit(&mut all);
    write_lines(path, &all);
}

/// Applies `edit` to the JSON of line `n` (1-based) and writes the file back.
fn edit_line(path: &Path, n: usize, edit: impl FnOnce(&mut Value)) {
    edit_lines(path, |all| {
        let mut v: Value = serde_json::from_str(&all[n - 1]).expect("json");
        edit(&mut v);
        all[n - 1] = serde_json::to_string(&v).expect("json");
    });
}

/// Asserts that `err` says the chain breaks at `line` (1-based).
fn assert_chain_broken_at(err: &LedgerError, line: u64) {
    assert!(
        matches!(err, LedgerError::ChainBroken { line: at, .. } if *at == line),
        "{err}"
    );
}

fn verify_err(path: &Path) -> LedgerError {
    Ledger::<Ev>::verify(path).expect_err("verify must fail")
}

#[test]
fn append_reopen_and_continue() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = ledger_path(&dir);
    {
        let mut ledger = Ledger::<Ev>::open(&path).expect("open creates the file and directory");
        assert!(ledger.is_empty());
        assert_eq!(ledger.head(), genesis());
        let first = ledger
            .append(&Ev::Started { run: "r1".into() })
            .expect("append")
            .clone();
        assert_eq!(first.seq, 1);
        assert_eq!(first.prev.to_hex(), GENESIS_HEX);
        let second = ledger.append(&step(1)).expect("append").clone();
        assert_eq!(second.seq, 2);
        assert_eq!(second.prev, first.hash);
        assert_eq!(ledger.head(), second.hash);
        assert_eq!(ledger.next_seq(), 3);
    }
    let mut ledger = Ledger::<Ev>::open(&path).expect("reopen");
    assert_eq!(ledger.len(), 2);
    assert_eq!(ledger.entries()[0].event, Ev::Started { run: "r1".into() });
    assert_eq!(ledger.entries()[1].event, step(1));
    let third = ledger
        .append(&step(2))
        .expect("append after reopen")
        .clone();
    assert_eq!(third.seq, 3);
    assert_eq!(third.prev, ledger.entries()[1].hash);

    let report = Ledger::<Ev>::verify(&path).expect("verify");
    assert_eq!(report.entries, 3);
    assert_eq!(report.head, third.hash);
    assert_eq!(report.torn_tail_bytes, None);
    let read = Ledger::<Ev>::read(&path).expect("read");
    assert_eq!(read, ledger.entries());
}

#[test]
fn each_line_is_one_json_object_whose_hash_covers_seq_time_prev_event() {
    let (_dir, path) = filled(3);
    let text = fs::read_to_string(&path).expect("read");
    assert!(text.ends_with('\n'));
    let mut prev = GENESIS_HEX.to_string();
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line).expect("json line");
        let obj = v.as_object().expect("object");
        let mut keys: Vec<_> = obj.keys().cloned().collect();
        keys.sort();
        assert_eq!(keys, ["event", "hash", "prev", "seq", "time"]);
        assert_eq!(obj["seq"], json!(i as u64 + 1));
        assert_eq!(obj["prev"], json!(prev));
        let time = obj["time"].as_str().expect("time string");
        assert!(time.ends_with('Z'), "UTC time: {time}");
        chrono::DateTime::parse_from_rfc3339(time).expect("RFC 3339");
        let expected = ContentHash::of_bytes(
            canonical_json(&json!({
                "seq": obj["seq"], "time": obj["time"], "prev": obj["prev"], "event": obj["event"]
            }))
            .as_bytes(),
        );
        assert_eq!(obj["hash"], json!(expected.to_hex()));
        prev = expected.to_hex();
    }
}

#[test]
fn an_edited_event_field_fails_verify_at_that_line() {
    let (_dir, path) = filled(5);
    edit_line(&path, 3, |v| v["event"]["n"] = json!(99));
    let err = verify_err(&path);
    assert_chain_broken_at(&err, 3);
    // open refuses it too, naming the same line.
    let err = Ledger::<Ev>::open(&path).expect_err("open must refuse");
    assert_eq!(err.line(), Some(3));
}

#[test]
fn an_edited_hash_fails_verify_at_that_line() {
    let (_dir, path) = filled(5);
    edit_line(&path, 2, |v| v["hash"] = json!("ab".repeat(32)));
    assert_chain_broken_at(&verify_err(&path), 2);
}

#[test]
fn an_edited_time_or_seq_fails_verify_at_that_line() {
    let (_dir, path) = filled(4);
    edit_line(&path, 4, |v| {
        v["time"] = json!("2001-01-01T00:00:00.000000Z")
    });
    assert_eq!(verify_err(&path).line(), Some(4));

    let (_dir2, path2) = filled(4);
    edit_line(&path2, 2, |v| v["seq"] = json!(7));
    assert_chain_broken_at(&verify_err(&path2), 2);
}

#[test]
fn a_rehashed_edit_still_breaks_the_next_link() {
    // An attacker who recomputes the edited line's own hash breaks the next line's prev.
    let (_dir, path) = filled(4);
    edit_line(&path, 2, |v| {
        v["event"]["n"] = json!(42);
        let h = ContentHash::of_bytes(
            canonical_json(&json!({
                "seq": v["seq"], "time": v["time"], "prev": v["prev"], "event": v["event"]
            }))
            .as_bytes(),
        );
        v["hash"] = json!(h.to_hex());
    });
    assert_chain_broken_at(&verify_err(&path), 3);
}

#[test]
fn a_deleted_line_fails_verify_at_that_line() {
    let (_dir, path) = filled(5);
    edit_lines(&path, |all| {
        all.remove(2); // line 3
    });
    assert_chain_broken_at(&verify_err(&path), 3);
}

#[test]
fn a_swapped_pair_of_lines_fails_verify_at_the_first() {
    let (_dir, path) = filled(5);
    edit_lines(&path, |all| all.swap(1, 2)); // lines 2 and 3
    assert_chain_broken_at(&verify_err(&path), 2);
}

#[test]
fn an_unparsable_middle_line_is_a_bad_line() {
    let (_dir, path) = filled(4);
    edit_lines(&path, |all| all[1] = "{not json".into());
    let err = verify_err(&path);
    assert!(matches!(err, LedgerError::BadLine { line: 2, .. }), "{err}");
    let err = Ledger::<Ev>::open(&path).expect_err("open must refuse");
    assert!(matches!(err, LedgerError::BadLine { line: 2, .. }), "{err}");

    // An empty line in the middle is bad as well.
    let (_dir2, path2) = filled(3);
    edit_lines(&path2, |all| all.insert(1, String::new()));
    assert_eq!(verify_err(&path2).line(), Some(2));
}

#[test]
fn an_unknown_field_is_a_bad_line() {
    let (_dir, path) = filled(3);
    edit_line(&path, 3, |v| v["approved"] = json!(true));
    let err = verify_err(&path);
    assert!(matches!(err, LedgerError::BadLine { line: 3, .. }), "{err}");
}

#[test]
fn an_event_of_the_wrong_schema_is_a_bad_line() {
    // A chain that is perfectly valid for free-form JSON events...
    let dir = tempfile::tempdir().expect("tempdir");
    let path = ledger_path(&dir);
    let mut any = Ledger::<Value>::open(&path).expect("open");
    any.append(&serde_json::to_value(step(1)).expect("json"))
        .expect("append");
    any.append(&json!({"type": "launch-missiles"}))
        .expect("append");
    assert_eq!(
        Ledger::<Value>::verify(&path).expect("valid chain").entries,
        2
    );
    // ...is refused at line 2 when read as Ev.
    let err = verify_err(&path);
    assert!(matches!(err, LedgerError::BadLine { line: 2, .. }), "{err}");
}

#[test]
fn a_torn_last_line_is_truncated_and_appending_continues() {
    let (_dir, path) = filled(3);
    let good_len = fs::metadata(&path).expect("stat").len();
    let mut bytes = fs::read(&path).expect("read");
    bytes.extend_from_slice(br#"{"event":{"type":"step","key":"red/T4","n"#);
    fs::write(&path, &bytes).expect("write torn tail");

    let report = Ledger::<Ev>::verify(&path).expect("a torn tail is not corruption");
    assert_eq!(report.entries, 3);
    assert!(report.torn_tail_bytes.is_some_and(|n| n > 0));

    let mut ledger = Ledger::<Ev>::open(&path).expect("open repairs");
    assert_eq!(ledger.len(), 3);
    assert_eq!(fs::metadata(&path).expect("stat").len(), good_len);
    let e = ledger.append(&step(4)).expect("append");
    assert_eq!(e.seq, 4);
    let report = Ledger::<Ev>::verify(&path).expect("verify");
    assert_eq!(report.entries, 4);
    assert_eq!(report.torn_tail_bytes, None);
}

#[test]
fn a_complete_last_entry_without_its_newline_is_kept() {
    let (_dir, path) = filled(3);
    let mut bytes = fs::read(&path).expect("read");
    assert_eq!(bytes.pop(), Some(b'\n'));
    fs::write(&path, &bytes).expect("write");
    let mut ledger = Ledger::<Ev>::open(&path).expect("open");
    assert_eq!(ledger.len(), 3, "the complete entry is kept");
    assert!(fs::read(&path).expect("read").ends_with(b"\n"));
    assert_eq!(ledger.append(&step(4)).expect("append").seq, 4);
    assert_eq!(Ledger::<Ev>::verify(&path).expect("verify").entries, 4);
}

#[test]
fn a_parsable_but_invalid_last_line_without_newline_is_an_error() {
    let (_dir, path) = filled(3);
    let mut all = lines(&path);
    let mut v: Value = serde_json::from_str(&all[2]).expect("json");
    v["event"]["n"] = json!(1000);
    all[2] = serde_json::to_string(&v).expect("json");
    fs::write(&path, all.join("\n")).expect("write without final newline");
    let err = Ledger::<Ev>::open(&path).expect_err("not a crash artifact");
    assert_chain_broken_at(&err, 3);
}

#[test]
fn a_line_over_the_cap_is_a_typed_error() {
    let (_dir, path) = filled(2);
    let mut bytes = fs::read(&path).expect("read");
    bytes.extend(std::iter::repeat_n(b'x', 5000));
    bytes.push(b'\n');
    fs::write(&path, &bytes).expect("write");
    let options = LedgerOptions {
        max_line_bytes: 1024,
        ..LedgerOptions::default()
    };
    let err = Ledger::<Ev>::verify_with(&path, options).expect_err("too long");
    assert!(
        matches!(
            err,
            LedgerError::LineTooLong {
                line: 3,
                limit: 1024
            }
        ),
        "{err}"
    );
    let err = Ledger::<Ev>::open_with(&path, options).expect_err("too long");
    assert_eq!(err.line(), Some(3));

    // An event whose line would pass the cap is refused before anything is written.
    let dir = tempfile::tempdir().expect("tempdir");
    let small = ledger_path(&dir);
    let mut ledger = Ledger::<Ev>::open_with(&small, options).expect("open");
    let err = ledger
        .append(&Ev::Note {
            text: "y".repeat(2000),
        })
        .expect_err("too large");
    assert!(matches!(err, LedgerError::Event { .. }), "{err}");
    assert_eq!(fs::metadata(&small).expect("stat").len(), 0);
}

#[test]
fn a_held_lock_gives_locked() {
    let (_dir, path) = filled(1);
    let options = LedgerOptions {
        lock_timeout: Duration::from_millis(30),
        ..LedgerOptions::default()
    };
    let mut ledger = Ledger::<Ev>::open_with(&path, options).expect("open");
    let holder = fs::File::open(&path).expect("open");
    holder.lock().expect("hold the lock");
    let err = ledger.append(&step(2)).expect_err("locked");
    assert!(matches!(err, LedgerError::Locked { .. }), "{err}");
    assert!(Ledger::<Ev>::open_with(&path, options).is_err());
    holder.unlock().expect("unlock");
    assert_eq!(ledger.append(&step(2)).expect("append").seq, 2);
}

#[test]
fn concurrent_appends_from_two_handles_are_serialised() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = ledger_path(&dir);
    Ledger::<Ev>::open(&path).expect("create");
    let per_handle = 40u32;
    let threads: Vec<_> = (0..2u32)
        .map(|t| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut ledger = Ledger::<Ev>::open(&path).expect("open");
                for i in 0..per_handle {
                    ledger
                        .append(&Ev::Step {
                            key: format!("h{t}"),
                            n: i,
                        })
                        .expect("append");
                }
                ledger
            })
        })
        .collect();
    let handles: Vec<_> = threads
        .into_iter()
        .map(|t| t.join().expect("thread"))
        .collect();
    let report = Ledger::<Ev>::verify(&path).expect("chain stays valid");
    assert_eq!(report.entries, u64::from(2 * per_handle));
    let entries = Ledger::<Ev>::read(&path).expect("read");
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e.seq, i as u64 + 1);
    }
    // Each handle's own events appear in its order.
    for t in 0..2 {
        let ns: Vec<u32> = entries
            .iter()
            .filter_map(|e| match &e.event {
                Ev::Step { key, n } if *key == format!("h{t}") => Some(*n),
                _ => None,
            })
            .collect();
        assert_eq!(ns, (0..per_handle).collect::<Vec<_>>());
    }
    // The handle that appended last has seen everything the other wrote.
    let longest = handles.iter().map(Ledger::len).max().expect("two handles");
    assert_eq!(longest, 2 * per_handle as usize);
}

#[test]
fn refresh_picks_up_another_writers_entries() {
    let (_dir, path) = filled(2);
    let mut run = Ledger::<Ev>::open(&path).expect("run's handle");
    let mut cli = Ledger::<Ev>::open(&path).expect("cli's handle");
    cli.append(&Ev::Note {
        text: "approved design".into(),
    })
    .expect("cli append");
    let new = run.refresh().expect("refresh");
    assert_eq!(new.len(), 1);
    assert_eq!(
        new[0].event,
        Ev::Note {
            text: "approved design".into()
        }
    );
    assert!(run.refresh().expect("refresh again").is_empty());
    // The run's next append continues after the CLI's entry.
    assert_eq!(run.append(&step(9)).expect("append").seq, 4);
    assert_eq!(cli.append(&step(10)).expect("append").seq, 5);
    assert_eq!(Ledger::<Ev>::verify(&path).expect("verify").entries, 5);
}

#[test]
fn a_ledger_truncated_behind_a_handle_is_refused() {
    let (_dir, path) = filled(3);
    let mut ledger = Ledger::<Ev>::open(&path).expect("open");
    let all = lines(&path);
    write_lines(&path, &all[..1]);
    let err = ledger.append(&step(4)).expect_err("shrunk");
    assert!(matches!(err, LedgerError::Truncated { .. }), "{err}");
}

#[test]
fn a_ledger_replaced_behind_a_handle_gets_the_next_entry_not_the_old_file() {
    // The handle keeps its file open between appends. When the path is replaced (a copy renamed
    // over it: a new inode), the next entry must land in the file the path names.
    let (_dir, path) = filled(2);
    let mut ledger = Ledger::<Ev>::open(&path).expect("open");
    ledger.append(&step(3)).expect("append");
    let copy = path.with_extension("copy");
    fs::copy(&path, &copy).expect("copy");
    fs::rename(&copy, &path).expect("replace");
    assert_eq!(ledger.append(&step(4)).expect("append").seq, 4);
    assert_eq!(
        lines(&path).len(),
        4,
        "the entry is in the file the path names"
    );
    assert_eq!(Ledger::<Ev>::verify(&path).expect("verify").entries, 4);

    // Replaced by a shorter file: refused, as a truncation is.
    let all = lines(&path);
    let shorter = path.with_extension("short");
    write_lines(&shorter, &all[..1]);
    fs::rename(&shorter, &path).expect("replace");
    let err = ledger.append(&step(5)).expect_err("shorter");
    assert!(matches!(err, LedgerError::Truncated { .. }), "{err}");
}

#[test]
fn verify_of_a_missing_file_is_an_io_error_and_open_of_a_directory_fails() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Ledger::<Ev>::verify(dir.path().join("nope.jsonl")).expect_err("missing");
    assert!(matches!(err, LedgerError::Io { .. }), "{err}");
    let err = Ledger::<Ev>::open(dir.path()).expect_err("a directory");
    assert!(matches!(err, LedgerError::Io { .. }), "{err}");
}

/// Set (to `N`) only by `crash_after_the_nth_append_keeps_exactly_n_entries` for its child:
/// the child aborts right after its `N`-th append. Read by this test binary alone.
const CRASH_CHILD_ENV: &str = "LEDGER_TEST_CRASH_AFTER";

/// Appends five events. Run by itself it checks them; run as the child of
/// `crash_after_the_nth_append_keeps_exactly_n_entries` (with [`CRASH_CHILD_ENV`] set) the
/// process aborts after the third.
#[test]
fn crash_child_appends_five_events() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = std::env::var_os("CONSORT_TEST_LEDGER")
        .map(PathBuf::from)
        .unwrap_or_else(|| ledger_path(&dir));
    let observer = std::env::var(CRASH_CHILD_ENV)
        .ok()
        .and_then(|n| n.parse().ok())
        .map(AbortAfter);
    let mut ledger = Ledger::<Ev>::open(&path).expect("open");
    for i in 1..=5 {
        ledger.append(&step(i)).expect("append");
        if let Some(observer) = &observer {
            let _ = observer.appended(u64::from(i));
        }
    }
    assert_eq!(Ledger::<Ev>::verify(&path).expect("verify").entries, 5);
}

#[test]
fn crash_after_the_nth_append_keeps_exactly_n_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = ledger_path(&dir);
    let status = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "crash_child_appends_five_events",
            "--exact",
            "--test-threads=1",
            "--quiet",
        ])
        .env(CRASH_CHILD_ENV, "3")
        .env("CONSORT_TEST_LEDGER", &path)
        .output()
        .expect("run the child");
    assert!(!status.status.success(), "the child must abort");
    let report = Ledger::<Ev>::verify(&path).expect("what was fsynced is intact");
    assert_eq!(report.entries, 3);
    let mut ledger = Ledger::<Ev>::open(&path).expect("reopen");
    assert_eq!(ledger.entries()[2].event, step(3));
    assert_eq!(ledger.append(&step(4)).expect("append").seq, 4);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.jsonl");
        fs::write(&path, &bytes).expect("write");
        let options = LedgerOptions { max_line_bytes: 512, ..LedgerOptions::default() };
        match Ledger::<Ev>::verify_with(&path, options) {
            Ok(report) => prop_assert!(report.entries <= bytes.len() as u64),
            Err(e) => prop_assert!(!matches!(e, LedgerError::Io { .. }), "unexpected {e}"),
        }
        let _ = Ledger::<Ev>::open_with(&path, options);
    }

    #[test]
    fn random_json_lines_never_panic(
        values in proptest::collection::vec(arb_json(), 1..6),
        keep in 0usize..4,
    ) {
        // A valid prefix, then lines mixing random JSON and mutated entry fields.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.jsonl");
        {
            let mut ledger = Ledger::<Ev>::open(&path).expect("open");
            for i in 0..keep { ledger.append(&step(i as u32)).expect("append"); }
        }
        let mut text = fs::read_to_string(&path).expect("read");
        for (i, v) in values.iter().enumerate() {
            let line = if i % 2 == 0 {
                serde_json::to_string(v).expect("json")
            } else {
                serde_json::to_string(&json!({
                    "seq": v, "time": v, "prev": GENESIS_HEX, "hash": GENESIS_HEX, "event": v
                })).expect("json")
            };
            text.push_str(&line);
            text.push('\n');
        }
        fs::write(&path, &text).expect("write");
        let err = Ledger::<Ev>::verify(&path).expect_err("random lines are not a valid chain");
        prop_assert_eq!(err.line(), Some(keep as u64 + 1));
    }
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        ".{0,20}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        let arrays = proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array);
        let objects = proptest::collection::btree_map(".{0,8}", inner, 0..4)
            .prop_map(|m| Value::Object(m.into_iter().collect()));
        prop_oneof![arrays, objects]
    })
}
