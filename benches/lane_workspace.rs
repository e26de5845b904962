//! What a lane's workspace costs: making and removing a scratch lane (`ScratchLane`, what
//! the merge check and `consort doctor` use, and what `consort run --parallel N` does for each
//! lane) of a repository of 1,000 tracked files whose tree has a `node_modules` of 1,000
//! installed packages (10 files each), beside its floor in the same run: the same `git worktree
//! add` and `git worktree remove` by hand, without the links. No goal is judged: the links
//! cost one symbolic link per installed package, which this bench measures (alone, into an
//! empty directory, too) so that BENCHMARKS.md can say what a lane costs. Also shown: linking
//! into a lane that has every link already (what a resumed lane pays).
//!
//! `cargo bench --bench lane_workspace`

#[path = "common/mod.rs"]
mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::{interleave, median_of, report_line, report_ratio};
use consort::lanes::{ScratchLane, link_dependencies};
use criterion::{Criterion, criterion_group, criterion_main};

/// Tracked files of the repository, and installed packages with their files.
const TRACKED: usize = 1_000;
const PACKAGES: usize = 1_000;
const FILES_PER_PACKAGE: usize = 10;

/// The repository: `TRACKED` source files committed, `node_modules` ignored and installed.
fn repository(root: &Path) {
    for n in 0..TRACKED {
        let path = root.join(format!("src/m{:02}/f{n:04}.js", n / 100));
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, format!("export const n{n} = {n};\n")).expect("write");
    }
    for p in 0..PACKAGES {
        let package = root.join(format!("node_modules/pkg-{p:04}"));
        std::fs::create_dir_all(&package).expect("mkdir");
        for f in 0..FILES_PER_PACKAGE {
            std::fs::write(package.join(format!("f{f}.js")), "module.exports = 1;\n")
                .expect("write");
        }
    }
    std::fs::write(root.join(".gitignore"), "node_modules/\n").expect("gitignore");
    common::git(root, &["init", "-q", "-b", "main"]);
    common::git(root, &["add", "-A"]);
    common::git(
        root,
        &[
            "-c",
            "user.name=bench",
            "-c",
            "user.email=bench@example.com",
            "commit",
            "-q",
            "-m",
            "the project",
        ],
    );
}

fn bench(c: &mut Criterion) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("shop");
    repository(&dir);
    let lane = || {
        let t = Instant::now();
        let lane = ScratchLane::make(&dir, "+bench", "HEAD").expect("a scratch lane");
        drop(lane);
        t.elapsed()
    };
    let by_hand = tmp.path().join("by-hand");
    let checkout = || {
        let t = Instant::now();
        let path = by_hand.to_string_lossy();
        common::git(&dir, &["worktree", "add", "-q", "--detach", &path, "HEAD"]);
        common::git(&dir, &["worktree", "remove", "--force", &path]);
        t.elapsed()
    };
    let mut g = common::group(c, "lane_workspace", 500, 5);
    common::bench_timed(&mut g, "make and remove a lane, dependencies linked", lane);
    common::bench_timed(&mut g, "git worktree add and remove", checkout);
    g.finish();
    if common::profiling() {
        return;
    }
    let pair = interleave(15, lane, checkout);
    report_ratio(
        "a lane of 1,000 files with 1,000 packages linked",
        &pair,
        "the same git worktree, no links",
        None,
    );
    let bare = tmp.path().join("bare");
    let link_only = median_of(15, || {
        std::fs::create_dir_all(&bare).expect("mkdir");
        let t = Instant::now();
        link_dependencies(&dir, &bare).expect("linked");
        let took = t.elapsed();
        std::fs::remove_dir_all(&bare).expect("rm");
        took
    });
    report_line(
        "the links alone, into an empty directory",
        &common::fmt(link_only),
    );
    let kept = ScratchLane::make(&dir, "+kept", "HEAD").expect("a scratch lane");
    let relink: Duration = median_of(15, || {
        let t = Instant::now();
        let made = link_dependencies(&dir, kept.root()).expect("linked");
        assert_eq!(made, 0, "a lane that has every link gets none again");
        t.elapsed()
    });
    report_line(
        "a resumed lane's links, all there already",
        &common::fmt(relink),
    );
}

criterion_group!(benches, bench);
criterion_main!(benches);
