//! The pure state machine: time per transition over a full scripted lifecycle (design lane with
//! a revision and UX, design gate, six tests through RED → GREEN → REFACTOR (a real change,
//! applied and verified) → REVIEW, deploy gate, deploy run, promote gate, promote).
//!
//! Floors, measured in the same run: an empty loop over the same events (nothing), and cloning
//! the state the machine holds before each event (the least any `(state, event) -> state`
//! function that returns a new state must do).
//!
//! `cargo bench --bench state_machine`

#[path = "common/mod.rs"]
mod common;

use std::hint::black_box;
use std::time::{Duration, Instant};

use common::{Script, Simulation, interleave, median_of, report_line, report_ratio};
use consort::actors::{Event, Machine, State};
use criterion::{Criterion, Throughput, criterion_group, criterion_main};

struct Recorded {
    machine: Machine,
    events: Vec<Event>,
    /// The state before each event.
    before: Vec<State>,
}

fn record() -> Recorded {
    let sim = Simulation::new(Script::default());
    let machine = sim.machine.clone();
    let (events, _) = sim.run();
    let mut before = Vec::with_capacity(events.len());
    let mut s = State::default();
    for e in &events {
        before.push(s.clone());
        s = machine.step(&s, e).expect("replays").0;
    }
    Recorded {
        machine,
        events,
        before,
    }
}

fn replay(r: &Recorded) -> State {
    let mut s = State::default();
    for e in &r.events {
        s = r.machine.step(&s, black_box(e)).expect("replays").0;
    }
    s
}

fn clone_each(r: &Recorded) -> usize {
    let mut n = 0;
    for s in &r.before {
        n += black_box(s.clone()).receipts.len();
    }
    n
}

fn empty_loop(r: &Recorded) -> usize {
    let mut n = 0;
    for e in &r.events {
        n += black_box(e).name().len();
    }
    n
}

fn per_event(r: &Recorded, reps: u32, f: impl Fn(&Recorded)) -> Duration {
    let t = Instant::now();
    for _ in 0..reps {
        f(r);
    }
    t.elapsed() / (reps * r.events.len() as u32)
}

fn bench(c: &mut Criterion) {
    let r = record();
    let n = r.events.len() as u64;
    let largest = r
        .before
        .iter()
        .map(|s| serde_json::to_string(s).map(|j| j.len()).unwrap_or(0))
        .max()
        .unwrap_or(0);
    println!(
        "lifecycle: {n} transitions, final state {} receipts, largest state {largest} bytes as JSON",
        r.before.last().map_or(0, |s| s.receipts.len())
    );

    let mut g = c.benchmark_group("state_machine");
    g.throughput(Throughput::Elements(n));
    g.sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    g.bench_function("lifecycle (all transitions)", |b| b.iter(|| replay(&r)));
    g.bench_function("floor: clone the state before each event", |b| {
        b.iter(|| clone_each(&r))
    });
    g.bench_function("floor: empty loop over the events", |b| {
        b.iter(|| empty_loop(&r))
    });
    g.finish();

    if common::profiling() {
        return;
    }
    // Side by side, interleaved: per transition.
    let reps = 20;
    let pair = interleave(
        31,
        || per_event(&r, reps, |r| drop(replay(r))),
        || {
            per_event(&r, reps, |r| {
                black_box(clone_each(r));
            })
        },
    );
    let nothing = median_of(31, || {
        per_event(&r, reps, |r| {
            black_box(empty_loop(r));
        })
    });
    report_ratio(
        "state machine, per transition",
        &pair,
        "clone of the state",
        None,
    );
    report_line(
        "state machine, floor (nothing)",
        &format!(
            "empty loop {} per event; full lifecycle of {n} transitions {}",
            common::fmt(nothing),
            common::fmt(pair.figure * n as u32)
        ),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
