//! The shared store on a real PostgreSQL database (a branch of the test cluster): ledgers as
//! hash-chained rows that read back as the file ledger's lines do, appends serialised across
//! connections, leases that run out and are taken over with a higher token, a stale lease's
//! late append refused, and bad rows and a newer schema refused with clear errors.

use std::time::Duration;

use consort_actors::{Entry, Event, HumanDecision, Ledger};
use consort_lakebase::ConnectInfo;
use consort_lakebase::store::{Fence, Lease, PgStore, StoreError};

/// A fresh database for a store, on the shared cluster.
async fn store_database() -> ConnectInfo {
    consort_testkit::cluster::scratch_database().await
}

/// Appends decision `n` to feature `f1`'s ledger in `store`, for `fence`.
async fn append_f1(
    store: &mut PgStore,
    n: usize,
    fence: Fence<'_>,
) -> Result<Entry<Event>, StoreError> {
    store.append("f1", &decision(n), fence).await
}

/// Appends decision `n` to `f1` under `fence`: recorded, as `why` says.
async fn recorded(store: &mut PgStore, n: usize, fence: Fence<'_>, why: &str) -> Entry<Event> {
    append_f1(store, n, fence).await.expect(why)
}

/// Appends decision `n` to `f1` under a lease that no longer holds: refused as stale, with a
/// message that says `says`.
async fn stale(store: &mut PgStore, n: usize, lease: &Lease, says: &str) -> StoreError {
    let e = append_f1(store, n, Fence::Lease(lease))
        .await
        .expect_err("a stale lease records nothing");
    assert!(
        matches!(e, StoreError::StaleLease { .. }) && e.to_string().contains(says),
        "{e}"
    );
    e
}

/// A connection to project `shop`'s store in `info`.
async fn shop(info: &ConnectInfo) -> PgStore {
    PgStore::connect(info, "shop").await.expect("store")
}

/// Two clones of project `shop` (two machines, or a worker and a person's laptop), each with
/// its own connection to one new store.
async fn two_clones() -> (PgStore, PgStore) {
    let info = store_database().await;
    (shop(&info).await, shop(&info).await)
}

/// The lease of `feature` that `holder` takes for `ttl`; `why` says why it is free.
async fn take(store: &PgStore, feature: &str, holder: &str, ttl: Duration, why: &str) -> Lease {
    store
        .acquire(feature, holder, ttl)
        .await
        .expect("acquire")
        .expect(why)
}

fn decision(n: usize) -> Event {
    Event::Human {
        decision: if n.is_multiple_of(2) {
            HumanDecision::Retry
        } else {
            HumanDecision::Stop
        },
        by: format!("person {n}"),
    }
}

#[tokio::test]
async fn a_ledger_in_the_store_is_a_hash_chain_the_file_ledger_would_accept() {
    let info = store_database().await;
    let mut a = shop(&info).await;
    let mut b = PgStore::connect(&info, "shop")
        .await
        .expect("a second connection");
    // Two connections append in turn: one chain, no sequence number twice.
    for n in 0..6 {
        let store = if n % 2 == 0 { &mut a } else { &mut b };
        let entry = recorded(store, n, Fence::Person, "appended").await;
        assert_eq!(entry.seq, n as u64 + 1);
    }
    let entries = b.entries("f1").await.expect("read back");
    assert_eq!(entries.len(), 6);
    assert_eq!(entries[5].event, decision(5));
    // Another project's, or another feature's, ledger is its own.
    let other = PgStore::connect(&info, "other").await.expect("store");
    assert!(other.entries("f1").await.expect("read").is_empty());
    assert!(a.entries("f2").await.expect("read").is_empty());

    // The rows are the file ledger's lines: written to a file, they verify as one.
    let client = consort_lakebase::connect(&info).await.expect("connect");
    let lines: Vec<String> = client
        .query(
            "SELECT line FROM consort_store.events WHERE project = 'shop' ORDER BY seq",
            &[],
        )
        .await
        .expect("rows")
        .iter()
        .map(|r| r.get(0))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("ledger.jsonl");
    std::fs::write(&file, lines.join("\n") + "\n").expect("write");
    let report = Ledger::<Event>::verify(&file).expect("the file ledger accepts them");
    assert_eq!(report.entries, 6);
    assert_eq!(report.head, entries[5].hash);
}

#[tokio::test]
async fn appenders_at_once_on_their_own_connections_make_one_chain() {
    let info = store_database().await;
    const WRITERS: usize = 6;
    const EACH: usize = 8;
    let mut writers = Vec::new();
    for w in 0..WRITERS {
        let info = info.clone();
        writers.push(tokio::spawn(async move {
            let mut store = shop(&info).await;
            let mut seqs = Vec::new();
            for n in 0..EACH {
                let entry = store
                    .append("f1", &decision(w * EACH + n), Fence::Person)
                    .await
                    .unwrap_or_else(|e| panic!("writer {w}'s append {n}: {e}"));
                seqs.push(entry.seq);
            }
            seqs
        }));
    }
    let mut seqs = Vec::new();
    for w in writers {
        seqs.extend(w.await.expect("writer"));
    }
    seqs.sort_unstable();
    let every: Vec<u64> = (1..=(WRITERS * EACH) as u64).collect();
    assert_eq!(seqs, every, "each sequence number once, none missing");
    let store = shop(&info).await;
    let entries = store
        .entries("f1")
        .await
        .expect("the chain reads back as one");
    assert_eq!(entries.len(), WRITERS * EACH);
}

#[tokio::test]
async fn features_added_at_once_from_many_machines_each_get_their_place() {
    let info = store_database().await;
    let mut adders = Vec::new();
    for n in 0..8 {
        let info = info.clone();
        adders.push(tokio::spawn(async move {
            let mut store = shop(&info).await;
            store
                .add_feature(&format!("f{n}"), "a request")
                .await
                .unwrap_or_else(|e| panic!("adding f{n}: {e}"))
        }));
    }
    for a in adders {
        assert!(a.await.expect("adder"), "added");
    }
    let store = shop(&info).await;
    let mut backlog = store.backlog().await.expect("backlog");
    backlog.sort();
    assert_eq!(backlog, (0..8).map(|n| format!("f{n}")).collect::<Vec<_>>());
}

#[tokio::test]
async fn a_person_s_decision_ends_the_driver_s_lease_at_once() {
    let (mut worker, mut laptop) = two_clones().await;
    let long = Duration::from_secs(60);
    let lease = take(&worker, "f1", "worker", long, "free").await;
    recorded(&mut worker, 0, Fence::Lease(&lease), "the driver appends").await;

    // A decision judged on the ledger before the driver's entry is refused: it records nothing
    // and leaves the driver's lease alone.
    let moved = laptop
        .append("f1", &decision(1), Fence::PersonJudgedOn { seen: 0 })
        .await
        .expect_err("judged on an older ledger");
    assert!(
        matches!(
            moved,
            StoreError::MovedOn {
                seen: 0,
                now: 1,
                ..
            }
        ),
        "{moved}"
    );
    assert!(
        worker.renew(&lease, long).await.expect("renew"),
        "still the driver's"
    );
    // A person stops the feature from another clone, long before the lease would run out.
    recorded(
        &mut laptop,
        1,
        Fence::PersonJudgedOn { seen: 1 },
        "the person's decision is recorded",
    )
    .await;
    // The driver records nothing after it.
    stale(&mut worker, 2, &lease, "ended by a person's decision").await;
    assert!(
        !worker.renew(&lease, long).await.expect("renew"),
        "its renewal says it holds the feature no more"
    );
    let next = take(
        &laptop,
        "f1",
        "another worker",
        long,
        "free at once, not after the lease's time",
    )
    .await;
    assert!(next.token > lease.token);
    let entries = laptop.entries("f1").await.expect("read");
    assert_eq!(entries.len(), 2, "the driver's late row is not there");

    // A decision while no one drives ends nothing and changes no token.
    laptop.release(&next).await.expect("released");
    recorded(&mut laptop, 3, Fence::Person, "recorded").await;
    let again = take(&worker, "f1", "worker", long, "free").await;
    assert_eq!(again.token, next.token + 1);
}

#[tokio::test]
async fn a_store_session_has_time_limits_and_a_lost_one_is_made_again() {
    use consort_lakebase::store::StoreHandle;
    let info = store_database().await;
    let store = shop(&info).await;
    for (name, limit) in [
        ("idle_in_transaction_session_timeout", "1s"),
        ("lock_timeout", "10s"),
        ("statement_timeout", "1min"),
    ] {
        assert_eq!(
            store.session_setting(name).await.expect("setting"),
            limit,
            "{name}"
        );
    }

    let handle = {
        let info = info.clone();
        tokio::task::spawn_blocking(move || StoreHandle::connect(&info, "shop"))
            .await
            .expect("thread")
            .expect("handle")
    };
    let handle = std::sync::Arc::new(handle);
    let call = |f: fn(&StoreHandle) -> Result<bool, StoreError>| {
        let handle = std::sync::Arc::clone(&handle);
        async move {
            tokio::task::spawn_blocking(move || f(&handle))
                .await
                .expect("thread")
        }
    };
    assert!(call(|h| h.try_merge_lock()).await.expect("lock"), "taken");
    assert!(call(|h| h.merge_lock_intact()).await.expect("intact"));

    // The server ends the session that holds the merge lock (a restart, a network cut).
    let admin = consort_lakebase::connect(&info).await.expect("connect");
    let ended = admin
        .query_one(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_locks WHERE locktype = 'advisory' \
             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            &[],
        )
        .await
        .expect("terminate")
        .get::<_, i64>(0);
    assert_eq!(ended, 1, "the merge lock's session");
    tokio::time::sleep(Duration::from_millis(200)).await;

    // The next call finds the connection lost and makes it again: the store answers, and
    // says the merge lock went with the old session.
    let mut answered = call(|h| h.holdings().map(|_| true)).await;
    if answered.is_err() {
        answered = call(|h| h.holdings().map(|_| true)).await;
    }
    assert!(answered.is_ok(), "{answered:?}");
    assert!(
        !call(|h| h.merge_lock_intact()).await.expect("asked"),
        "a merge must not go on under a lock it lost"
    );
    assert!(
        call(|h| h.try_merge_lock()).await.expect("lock"),
        "taken again"
    );
    assert!(call(|h| h.merge_lock_intact()).await.expect("intact"));
}

/// A transaction the store's thread leaves behind stays open (its rows locked, its session
/// idle in a transaction, which the server ends after a second) until the connection is next
/// used: a look that finds nothing to take and a refused append end theirs at once.
#[tokio::test]
async fn a_worker_that_finds_nothing_or_is_refused_leaves_no_transaction_open() {
    use consort_lakebase::store::StoreHandle;
    let info = store_database().await;
    let other = shop(&info).await;
    let held = take(
        &other,
        "f1",
        "another worker",
        Duration::from_secs(60),
        "free",
    )
    .await;
    let worker = tokio::task::spawn_blocking(move || {
        let handle = StoreHandle::connect(&info, "shop").expect("handle");
        let none = handle
            .take_next(&["f1".to_string()], "worker", Duration::from_secs(60))
            .expect("looked");
        assert!(none.is_none(), "held by another");
        std::thread::sleep(Duration::from_millis(1500));
        let after_look = handle.holdings().map(|h| h.len());
        let mut stale = held.clone();
        stale.token -= 1;
        let refused = handle.append("f1", &decision(0), Some(&stale), 0);
        assert!(
            matches!(refused, Err(StoreError::StaleLease { .. })),
            "{refused:?}"
        );
        std::thread::sleep(Duration::from_millis(1500));
        (after_look, handle.holdings().map(|h| h.len()))
    })
    .await
    .expect("worker");
    assert_eq!(
        worker.0.ok(),
        Some(1),
        "the session lived on after the look"
    );
    assert_eq!(worker.1.ok(), Some(1), "and after the refused append");
}

#[tokio::test]
async fn a_lease_runs_out_is_taken_over_and_fences_its_old_holder() {
    let (mut worker_a, mut worker_b) = two_clones().await;
    let short = Duration::from_millis(300);
    let a = take(&worker_a, "f1", "machine-a", short, "free, so taken").await;
    assert!(
        worker_b
            .acquire("f1", "machine-b", short)
            .await
            .expect("acquire")
            .is_none(),
        "held, so not taken"
    );
    recorded(&mut worker_a, 0, Fence::Lease(&a), "the holder appends").await;
    assert!(
        worker_a.renew(&a, short).await.expect("renew"),
        "renewed in time"
    );

    // Machine A stops renewing (killed, cut off): its lease runs out and B takes the feature
    // over with a higher token.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let b = take(
        &worker_b,
        "f1",
        "machine-b",
        Duration::from_secs(30),
        "ran out, so taken over",
    )
    .await;
    assert!(b.token > a.token, "{} > {}", b.token, a.token);
    assert!(
        !worker_a.renew(&a, short).await.expect("renew"),
        "A's is gone"
    );

    // A comes back and tries to go on: nothing it writes is recorded.
    let late = stale(&mut worker_a, 1, &a, "taken over").await;
    assert!(
        matches!(&late, StoreError::StaleLease { token, .. } if *token == a.token),
        "{late}"
    );
    recorded(&mut worker_b, 2, Fence::Lease(&b), "the new holder appends").await;
    // A person's decision needs no lease.
    recorded(&mut worker_a, 3, Fence::Person, "a person appends").await;
    let events: Vec<Event> = worker_a
        .entries("f1")
        .await
        .expect("read")
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(events, [decision(0), decision(2), decision(3)]);

    // Given up, the lease is free again, and the next holder's token is higher still.
    worker_b.release(&b).await.expect("release");
    let again = take(&worker_a, "f1", "machine-a", short, "free").await;
    assert!(again.token > b.token);
    // A released lease records nothing.
    stale(&mut worker_b, 4, &b, "taken over").await;
}

#[tokio::test]
async fn a_bad_or_foreign_row_and_a_newer_schema_are_refused_by_name() {
    let info = store_database().await;
    let mut store = shop(&info).await;
    for n in 0..3 {
        recorded(&mut store, n, Fence::Person, "appended").await;
    }
    let client = consort_lakebase::connect(&info).await.expect("connect");
    // An edited event: its hash no longer matches its line.
    client
        .execute(
            "UPDATE consort_store.events SET line = replace(line, 'person 1', 'person 9') \
             WHERE project = 'shop' AND seq = 2",
            &[],
        )
        .await
        .expect("tamper");
    let err = store.entries("f1").await.expect_err("refused");
    assert!(
        matches!(&err, StoreError::BadRow { feature, seq: 2, .. } if feature == "f1"),
        "{err}"
    );
    assert!(err.to_string().contains("entry 2"), "{err}");
    // A row that is no ledger line at all, and a gap.
    client
        .batch_execute(
            "UPDATE consort_store.events SET line = '{\"not\": \"an entry\"}' \
             WHERE project = 'shop' AND seq = 2",
        )
        .await
        .expect("tamper");
    assert!(matches!(
        store.entries("f1").await,
        Err(StoreError::BadRow { seq: 2, .. })
    ));
    client
        .batch_execute("DELETE FROM consort_store.events WHERE project = 'shop' AND seq = 2")
        .await
        .expect("tamper");
    let gap = store.entries("f1").await.expect_err("a gap is refused");
    assert!(matches!(gap, StoreError::BadRow { seq: 3, .. }), "{gap}");

    // Rows too large to be Consort's: refused by their length, never read whole.
    client
        .batch_execute(
            "UPDATE consort_store.events SET line = repeat('x', 64 * 1024 * 1024 + 1) \
             WHERE project = 'shop' AND seq = 1; \
             INSERT INTO consort_store.documents (project, feature, name, body) \
             VALUES ('shop', 'f1', 'request.md', repeat('x', 1024 * 1024 + 1))",
        )
        .await
        .expect("tamper");
    let big = store
        .entries("f1")
        .await
        .expect_err("an oversized row is refused");
    assert!(matches!(big, StoreError::BadRow { seq: 1, .. }), "{big}");
    assert!(big.to_string().contains("more than the ledger's"), "{big}");
    let doc = store
        .documents()
        .await
        .expect_err("an oversized record is refused");
    assert!(
        doc.to_string().contains("request.md is larger than"),
        "{doc}"
    );

    // A schema a newer Consort made.
    client
        .batch_execute("UPDATE consort_store.version SET version = version + 1")
        .await
        .expect("newer");
    let newer = PgStore::connect(&info, "shop")
        .await
        .expect_err("a newer schema is refused");
    assert!(matches!(newer, StoreError::NewerSchema { .. }), "{newer}");
    assert!(newer.to_string().contains("upgrade Consort"), "{newer}");
}

/// The store as a conductor's event log: appends through the `EventLog` trait from a caller
/// on a runtime of its own, read back by a second log on open, a log opened under a lease
/// that was taken over records nothing, and a person's log records nothing once the ledger
/// moved on since it was read.
#[tokio::test]
async fn a_store_event_log_appends_inline_and_carries_its_lease() {
    use consort_actors::{EventLogError, OpenEventLog};
    use consort_lakebase::store::{PgEventLogOpener, StoreHandle};
    let info = store_database().await;
    let opener = PgEventLogOpener {
        store: std::sync::Arc::new(StoreHandle::connect(&info, "shop").expect("handle")),
        feature: "f1".into(),
        lease: None,
    };
    let mut log = opener.open().expect("opened");
    assert!(log.is_empty());
    for n in 0..3 {
        assert_eq!(
            log.append(&decision(n)).expect("appended").seq,
            n as u64 + 1
        );
    }
    let again = opener.open().expect("opened again");
    assert_eq!(again.entries(), log.entries());

    let store = shop(&info).await;
    let short = Duration::from_millis(200);
    let lease = take(&store, "f1", "machine-a", short, "free").await;
    let mut fenced = PgEventLogOpener {
        lease: Some(lease),
        ..opener.clone()
    }
    .open()
    .expect("opened under the lease");
    fenced.append(&decision(3)).expect("the holder appends");
    tokio::time::sleep(Duration::from_millis(300)).await;
    take(
        &store,
        "f1",
        "machine-b",
        Duration::from_secs(30),
        "taken over",
    )
    .await;
    let late = fenced
        .append(&decision(4))
        .expect_err("a stale lease records nothing");
    assert!(matches!(late, EventLogError::Store(_)), "{late}");
    let said = consort_actors::error_chain(&late);
    assert!(said.contains("no longer driven by this process"), "{said}");
    assert_eq!(opener.open().expect("opened").entries().len(), 4);

    // A person's log was opened on three entries; the holder appended a fourth since: the
    // decision, judged on what the log holds, is refused and records nothing. Opened again,
    // on the ledger as it is, it is recorded.
    let moved = log
        .append(&decision(5))
        .expect_err("judged on an older ledger");
    let said = consort_actors::error_chain(&moved);
    assert!(
        said.contains("moved on while the decision was being made")
            && said.contains("judged on 3 entries; the ledger now holds 4"),
        "{said}"
    );
    assert_eq!(opener.open().expect("opened").entries().len(), 4);
    let mut fresh = opener.open().expect("opened");
    fresh
        .append(&decision(5))
        .expect("judged on the ledger as it is");
    assert_eq!(opener.open().expect("opened").entries().len(), 5);
}

/// Workers on several connections take features from one backlog at once: each gets another,
/// in the backlog's order, none twice; a feature whose holder's time ran out is taken again.
#[tokio::test]
async fn workers_take_the_next_feature_no_one_holds_each_another() {
    let info = store_database().await;
    let backlog: Vec<String> = ["f1", "f2", "f3"].map(String::from).to_vec();
    let mut takers = Vec::new();
    for w in 0..4 {
        let info = info.clone();
        let backlog = backlog.clone();
        takers.push(tokio::spawn(async move {
            let mut store = shop(&info).await;
            store
                .take_next(&backlog, &format!("worker-{w}"), Duration::from_secs(30))
                .await
                .expect("take")
        }));
    }
    let mut taken = Vec::new();
    for t in takers {
        taken.push(t.await.expect("a taker"));
    }
    let mut features: Vec<String> = taken.iter().flatten().map(|l| l.feature.clone()).collect();
    features.sort();
    assert_eq!(
        features, backlog,
        "each feature once, to one worker: {taken:?}"
    );
    assert_eq!(
        taken.iter().filter(|t| t.is_none()).count(),
        1,
        "the fourth gets none"
    );

    // In order: f1's holder gives it up; the next taker gets f1 again, with a higher token.
    let mut store = shop(&info).await;
    let f1 = taken
        .iter()
        .flatten()
        .find(|l| l.feature == "f1")
        .expect("f1")
        .clone();
    store.release(&f1).await.expect("release");
    let again = store
        .take_next(&backlog, "worker-9", Duration::from_millis(100))
        .await
        .expect("take")
        .expect("f1 is free");
    assert_eq!(again.feature, "f1");
    assert!(again.token > f1.token);
    // Its time runs out: taken over by the next worker.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let over = store
        .take_next(&backlog, "worker-10", Duration::from_secs(30))
        .await
        .expect("take")
        .expect("f1 ran out");
    assert_eq!((over.feature.as_str(), over.token), ("f1", again.token + 1));
}

/// A feature whose run kills every worker that takes it (issue 49, item 7): each takeover
/// waits longer, and after `LOST_WORKERS_BOUND` workers lost in a row no worker takes it; it
/// waits for a person, whose decision lets the fleet take it again.
#[tokio::test]
async fn a_feature_that_keeps_losing_its_workers_waits_for_a_person() {
    use consort_lakebase::store::LOST_WORKERS_BOUND;
    let info = store_database().await;
    let backlog = vec!["f1".to_string()];
    // A lease of a second: the pause after the second loss (one more lease) is looked into
    // 0.1 s after the lease's end, 0.9 s before the pause's.
    let ttl = Duration::from_secs(1);
    let mut store = shop(&info).await;
    let past_its_end = || tokio::time::sleep(ttl + Duration::from_millis(100));
    let mut lost = 0;
    store
        .take_next(&backlog, "worker-0", ttl)
        .await
        .expect("take")
        .expect("f1 is free");
    for w in 1.. {
        past_its_end().await;
        lost += 1;
        let now = store.take_next(&backlog, &format!("worker-{w}"), ttl).await;
        if lost >= LOST_WORKERS_BOUND {
            assert!(now.expect("look").is_none(), "halted after {lost} lost");
            break;
        }
        if lost >= 2 {
            // The pause after the second loss is one lease longer: not yet.
            assert!(
                now.expect("look").is_none(),
                "backing off after {lost} lost"
            );
            tokio::time::sleep(ttl).await;
            store
                .take_next(&backlog, &format!("worker-{w}"), ttl)
                .await
                .expect("take")
                .expect("taken over after the pause");
        } else {
            now.expect("take")
                .expect("taken over at once after the first loss");
        }
    }
    // Later than any pause would last (three leases after the third loss), still nobody's: it
    // waits for a person, and says so.
    tokio::time::sleep(ttl * 4).await;
    assert!(
        store
            .take_next(&backlog, "worker-late", ttl)
            .await
            .expect("look")
            .is_none()
    );
    let held = store.holdings().await.expect("holdings");
    assert_eq!(held.len(), 1);
    assert!(held[0].halted_for_a_person(), "{held:?}");
    assert_eq!(held[0].lost + 1, LOST_WORKERS_BOUND as u32);
    // A person's decision: the fleet takes it again, counting from zero.
    recorded(&mut store, 1, Fence::Person, "a person decides").await;
    let again = store
        .take_next(&backlog, "worker-after", ttl)
        .await
        .expect("take")
        .expect("taken again");
    assert_eq!(again.feature, "f1");
    let held = store.holdings().await.expect("holdings");
    assert_eq!(held[0].lost, 0, "{held:?}");
}

/// Where each chain ends, for the scheduler's index (issue 49, item 8): one row per feature
/// with entries, its last entry's number and hash; none for a feature without.
#[tokio::test]
async fn the_heads_of_many_chains_are_read_at_once() {
    let info = store_database().await;
    let mut store = shop(&info).await;
    let mut last = None;
    for n in 0..3 {
        last = Some(recorded(&mut store, n, Fence::Person, "append").await);
    }
    store
        .append("f2", &decision(9), Fence::Person)
        .await
        .expect("append");
    let asked = ["f1", "f2", "f3"].map(String::from).to_vec();
    let mut heads = store.heads(&asked).await.expect("heads");
    heads.sort();
    let last = last.expect("three appends");
    assert_eq!(heads.len(), 2, "f3 has no entry: {heads:?}");
    assert_eq!(
        heads[0],
        ("f1".to_string(), 3, last.hash.to_hex()),
        "f1 ends at its third entry"
    );
    assert_eq!((heads[1].0.as_str(), heads[1].1), ("f2", 1));
}
