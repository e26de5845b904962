//! What freezing a test and not its file costs a RED: judging the file's new version on its
//! syntax tree (`judge`: both versions parsed with tree-sitter and compared item by item) for a
//! pytest file and a jest file of 10 and of 100 tests, a RED adding one test, beside the floor of
//! freezing the whole file (the SHA-256 of the old and the new version). Once per RED that writes
//! a file holding accepted tests, before the write; nothing else in a step parses.
//!
//! `cargo bench --bench test_outline`

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{interleave, report_ratio};
use consort::actors::{ContentHash, judge_test_file};
use criterion::{Criterion, criterion_group, criterion_main};

/// A pytest file of `n` tests sharing imports, a fixture and a helper.
fn python(n: usize) -> String {
    common::file_of_tests(
        "import os\n\nimport psycopg\nimport pytest\n\nfrom app import counts\n\n\n@pytest.fixture\ndef conn():\n    c = psycopg.connect(os.environ[\"DATABASE_URL\"])\n    yield c\n    c.close()\n\n\ndef total_of(c):\n    return counts.total(c)\n",
        n,
        |i| {
            format!(
                "\n\ndef test_total_{i}(conn):\n    conn.execute(\"INSERT INTO counts VALUES ('s{i}', {i})\")\n    assert total_of(conn) == {i}\n"
            )
        },
        "",
    )
}

/// A jest file of `n` tests in a `describe` block with a hook.
fn javascript(n: usize) -> String {
    common::file_of_tests(
        "const request = require('supertest');\nconst { createApp } = require('../app');\n\ndescribe('counts', () => {\n  let app;\n  beforeEach(async () => {\n    app = await createApp();\n  });\n",
        n,
        |i| {
            format!(
                "\n  test('total {i}', async () => {{\n    const res = await request(app).get('/total/{i}');\n    expect(res.status).toBe(200);\n  }});\n"
            )
        },
        "});\n",
    )
}

fn timed(reps: u32, f: impl Fn()) -> Duration {
    let t = Instant::now();
    for _ in 0..reps {
        f();
    }
    t.elapsed() / reps
}

fn bench(c: &mut Criterion) {
    let cases = [
        ("pytest", "tests/test_counts.py", python(10), python(11)),
        ("pytest", "tests/test_counts.py", python(100), python(101)),
        (
            "jest",
            "test/counts.test.js",
            javascript(10),
            javascript(11),
        ),
        (
            "jest",
            "test/counts.test.js",
            javascript(100),
            javascript(101),
        ),
    ];
    let mut g = c.benchmark_group("test_outline");
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(300))
        .measurement_time(Duration::from_secs(1));
    for (tool, path, old, new) in &cases {
        judge_test_file(path, old, new, None).expect("the RED only adds a test");
        g.bench_function(format!("{tool}, {} bytes: judge", old.len()), |b| {
            b.iter(|| judge_test_file(path, black_box(old), black_box(new), None))
        });
    }
    g.finish();
    if common::profiling() {
        return;
    }
    for (tool, path, old, new) in &cases {
        let reps = 20;
        let pair = interleave(
            21,
            || {
                timed(reps, || {
                    black_box(judge_test_file(path, old, new, None)).ok();
                })
            },
            || {
                timed(reps, || {
                    black_box(ContentHash::of_bytes(old.as_bytes()));
                    black_box(ContentHash::of_bytes(new.as_bytes()));
                })
            },
        );
        report_ratio(
            &format!(
                "a RED's write judged test by test, {tool} file of {} bytes",
                old.len()
            ),
            &pair,
            "SHA-256 of both versions (the file frozen whole)",
            None,
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
