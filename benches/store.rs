//! The shared store's append (`PgStore::append`: lock the feature's lease row, read the chain's
//! end, insert the next line, commit) on a database of the embedded cluster, beside a bare
//! `INSERT … ` committed on its own (autocommit) on the same server and connection kind, and
//! beside the file ledger's append (`Ledger::append`: lock, catch up, write, `fdatasync`) in the
//! system temp directory, in the same run. No goal is judged yet: the figures say what moving
//! the records into PostgreSQL costs per event.
//!
//! The test cluster runs with `fsync`, `synchronous_commit` and `full_page_writes` off, so its
//! commits do not wait for a disk; a production server's do, like the file ledger's fdatasync.
//!
//! `cargo bench --bench store`

#[path = "common/mod.rs"]
mod common;

use std::time::Instant;

use common::{interleave, report_line, report_ratio};
use consort::actors::{Event, HumanDecision, Ledger};
use consort::lakebase::connect;
use consort::lakebase::store::{Fence, PgStore};
use criterion::{Criterion, criterion_group, criterion_main};

/// An event of a typical small size.
fn event(n: u64) -> Event {
    Event::Human {
        decision: HumanDecision::Retry,
        by: format!("a person {n}"),
    }
}

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let (mut store, client) = rt.block_on(async {
        let info = consort_testkit::cluster::scratch_database().await;
        let store = PgStore::connect(&info, "bench").await.expect("store");
        let client = connect(&info).await.expect("connect");
        client
            .batch_execute("CREATE TABLE bare (id bigserial PRIMARY KEY, line text NOT NULL)")
            .await
            .expect("table");
        (store, client)
    });
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ledger = Ledger::<Event>::open(dir.path().join("ledger.jsonl")).expect("ledger");
    let line = serde_json::to_string(&event(0)).expect("json");
    let mut n = 0u64;
    let mut store_append = || {
        n += 1;
        let e = event(n);
        rt.block_on(async {
            let t = Instant::now();
            store.append("f1", &e, Fence::Person).await.expect("append");
            t.elapsed()
        })
    };
    let bare_insert = || {
        rt.block_on(async {
            let t = Instant::now();
            client
                .execute("INSERT INTO bare (line) VALUES ($1)", &[&line])
                .await
                .expect("insert");
            t.elapsed()
        })
    };
    let mut m = 0u64;
    let mut file_append = || {
        m += 1;
        let e = event(m);
        let t = Instant::now();
        ledger.append(&e).expect("append");
        t.elapsed()
    };
    let mut g = common::group(c, "store", 300, 3);
    common::bench_timed(&mut g, "store append", &mut store_append);
    common::bench_timed(&mut g, "bare INSERT, autocommit", bare_insert);
    common::bench_timed(&mut g, "file ledger append", &mut file_append);
    g.finish();
    if common::profiling() {
        return;
    }
    let pair = interleave(201, &mut store_append, bare_insert);
    report_ratio(
        "an event appended to the shared store",
        &pair,
        "a bare INSERT on the same server",
        None,
    );
    let file = interleave(201, &mut store_append, &mut file_append);
    report_ratio(
        "an event appended to the shared store",
        &file,
        "the file ledger's append with fdatasync",
        None,
    );
    report_line(
        "per event",
        &format!(
            "store {} | bare INSERT {} | file ledger {}",
            common::fmt(pair.figure),
            common::fmt(pair.floor),
            common::fmt(file.floor)
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
