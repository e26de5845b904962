//! The conductor's [`Workbench`]: one per build-step assignment, over the project's work tree,
//! with scratch runs made through the same Lakebase endpoint as the real runs.
//!
//! Reads are judged by the file a path physically reaches ([`WorkTree::resolve`]):
//! nothing outside the tree, nothing in Consort's state, version control or a skipped cache.
//! A scratch run copies the tree into a fresh temporary directory, checks the proposed change
//! set there by the step's own rules ([`ScratchPlan::check`]), applies it, and asks the
//! verifier for a run on a scratch branch, with the real tree's `.consort/` hidden from it as
//! well; the receipt is turned into [`Advice`] and dropped.

use std::io::Read;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use globset::{Glob, GlobMatcher};

use super::LakebaseEndpoint;
use super::blocking;
use crate::core::artifact::{ChangeSet, RequestId};
use crate::core::machine::ScratchPlan;
use crate::core::paths::PathPolicy;
use crate::core::protocol::VerifyRequest;
use crate::runtime::gate::BoxFuture;
use crate::runtime::workbench::{
    Advice, FileText, Hit, Hits, Listing, ToolError, Workbench, WorkbenchLimits,
};
use crate::worktree::{WorkTree, WorkTreeError};

/// Scratch requests are numbered from here, far from the run's own request ids.
const SCRATCH_IDS: u64 = 1 << 62;
/// Longest line a search returns.
const HIT_CHARS: usize = 200;
/// Largest file a search reads.
const SEARCH_FILE_BYTES: u64 = 1024 * 1024;

/// One step's workbench.
pub(super) struct StepBench {
    pub step: String,
    pub work: WorkTree,
    pub policy: PathPolicy,
    pub plan: Option<ScratchPlan>,
    pub lakebase: Arc<dyn LakebaseEndpoint>,
    pub timeout: Duration,
    pub limits: WorkbenchLimits,
    pub runs: AtomicU32,
    pub ids: Arc<AtomicU64>,
    /// What a scratch run may not read: the real tree's `.consort/` and the run's records.
    pub hidden: Vec<std::path::PathBuf>,
}

impl StepBench {
    /// The tree-relative path `path` reaches, when a step may read it.
    fn reach(&self, path: &str) -> Result<String, ToolError> {
        let refused = |reason: String| ToolError::Refused {
            path: path.to_string(),
            reason,
        };
        let rel = self
            .work
            .resolve(path)
            .map_err(|e| refused(crate::core::text::error_chain(&e)))?;
        // The path's own last component counts too: `.consort` itself is as refused as what
        // lies inside it.
        if let Some(dir) = self.work.filter().skipped_dir(&format!("{rel}/x")) {
            return Err(refused(format!("inside {dir}/, which no step reads")));
        }
        Ok(rel)
    }

    fn matcher(glob: Option<&str>) -> Result<Option<GlobMatcher>, ToolError> {
        glob.filter(|g| !g.trim().is_empty())
            .map(|g| {
                Glob::new(g)
                    .map(|g| g.compile_matcher())
                    .map_err(|e| ToolError::BadPattern(format!("bad glob {g}: {e}")))
            })
            .transpose()
    }

    fn files(&self, glob: Option<&str>) -> Result<Vec<(String, u64)>, ToolError> {
        let matcher = Self::matcher(glob)?;
        let files = self.work.files().map_err(failed)?;
        Ok(files
            .into_iter()
            .filter(|p| matcher.as_ref().is_none_or(|m| m.is_match(p)))
            .filter_map(|p| {
                let bytes = std::fs::metadata(self.work.root().join(&p)).ok()?.len();
                Some((p, bytes))
            })
            .collect())
    }

    /// Copies the tree, applies the checked change and asks for a scratch run.
    async fn scratch_run(
        &self,
        plan: &ScratchPlan,
        change: ChangeSet,
    ) -> Result<Advice, ToolError> {
        let dir = tempfile::Builder::new()
            .prefix("consort-scratch-run-")
            .tempdir()
            .map_err(|e| ToolError::Failed {
                detail: format!("cannot make a scratch directory: {e}"),
            })?;
        let (copy, hash) = blocking(|| -> Result<_, ToolError> {
            let copy = self.work.copy_into(dir.path()).map_err(failed)?;
            let (resolved, _) = copy.resolve_set(&change).map_err(rejected)?;
            let checked = plan
                .check(&self.policy, &resolved)
                .map_err(|v| ToolError::Rejected {
                    violation: v.to_string(),
                })?;
            copy.apply(&checked).map_err(rejected)?;
            let hash = copy.hash().map_err(failed)?;
            Ok((copy, hash))
        })?;
        // Only a change that runs uses one of the step's runs.
        let used = self.runs.fetch_add(1, Ordering::Relaxed) + 1;
        let request = VerifyRequest {
            id: RequestId(SCRATCH_IDS + self.ids.fetch_add(1, Ordering::Relaxed)),
            purpose: plan.purpose,
            work_tree: copy.root().to_path_buf(),
            workspace_hash: hash,
            files: None,
            migrations: plan.migrations.clone(),
            tests: plan.tests.clone(),
            focus: plan.focus.clone(),
            caches: self.work.filter().extra().to_vec(),
            hidden: self.hidden.clone(),
            select: plan.select.clone(),
            quarantined: plan.quarantined.clone(),
            harness: None,
            tool_records: Vec::new(),
        };
        let receipt = self
            .lakebase
            .verify(request, self.timeout)
            .await
            .map_err(|e| ToolError::Failed {
                detail: e.to_string(),
            })?;
        let mut verdict = plan.judge(&self.policy, &receipt);
        if !receipt.tree_changes.is_empty() {
            verdict.would_pass = false;
            verdict.verdict = format!(
                "the run changed the tree ({}), which the real run refuses.\n{}",
                receipt.tree_changes.join(", "),
                verdict.verdict
            );
        }
        Ok(Advice {
            would_pass: verdict.would_pass,
            verdict: verdict.verdict,
            outcomes: receipt.outcomes,
            runs_left: self.limits.runs.saturating_sub(used),
        })
    }
}

impl Workbench for StepBench {
    fn read(&self, path: &str) -> Result<FileText, ToolError> {
        let rel = self.reach(path)?;
        let full = self.work.root().join(&rel);
        let not_found = || ToolError::NotFound {
            path: path.to_string(),
        };
        let meta = std::fs::metadata(&full).map_err(|_| not_found())?;
        if meta.is_dir() {
            return Err(ToolError::Refused {
                path: path.to_string(),
                reason: "a directory: list its files with list_files".into(),
            });
        }
        // Only the part returned is read, however large the file.
        let limit = u64::try_from(self.limits.read_bytes).unwrap_or(u64::MAX);
        let bytes = blocking(|| -> std::io::Result<Vec<u8>> {
            let mut buf = Vec::new();
            std::fs::File::open(&full)?
                .take(limit)
                .read_to_end(&mut buf)?;
            Ok(buf)
        })
        .map_err(|_| not_found())?;
        let cut = (bytes.len() as u64) < meta.len();
        let text = match std::str::from_utf8(&bytes) {
            Ok(t) => t,
            // A cut through a character: keep what precedes it.
            Err(e) if cut && e.error_len().is_none() => {
                std::str::from_utf8(&bytes[..e.valid_up_to()]).unwrap_or_default()
            }
            Err(_) => {
                return Err(ToolError::NotText {
                    path: rel,
                    bytes: meta.len(),
                });
            }
        };
        Ok(FileText {
            truncated: (text.len() as u64) < meta.len(),
            text: text.to_string(),
            path: rel,
            bytes: meta.len(),
        })
    }

    fn list(&self, glob: Option<&str>) -> Result<Listing, ToolError> {
        let mut files = blocking(|| self.files(glob))?;
        let max = crate::core::context::MAX_LISTED;
        let more = files.len().saturating_sub(max) as u64;
        files.truncate(max);
        Ok(Listing { files, more })
    }

    fn search(&self, text: &str, glob: Option<&str>) -> Result<Hits, ToolError> {
        if text.is_empty() {
            return Err(ToolError::BadPattern("the search text is empty".into()));
        }
        let files = blocking(|| self.files(glob))?;
        let mut out = Hits::default();
        for (path, bytes) in files {
            if bytes > SEARCH_FILE_BYTES {
                continue;
            }
            let Ok(content) = std::fs::read_to_string(self.work.root().join(&path)) else {
                continue;
            };
            for (n, line) in content.lines().enumerate() {
                if !line.contains(text) {
                    continue;
                }
                if out.hits.len() == self.limits.hits {
                    out.more = true;
                    return Ok(out);
                }
                out.hits.push(Hit {
                    path: path.clone(),
                    line: u32::try_from(n + 1).unwrap_or(u32::MAX),
                    text: line.chars().take(HIT_CHARS).collect(),
                });
            }
        }
        Ok(out)
    }

    fn try_change(&self, change: ChangeSet) -> BoxFuture<'_, Result<Advice, ToolError>> {
        Box::pin(async move {
            let Some(plan) = &self.plan else {
                return Err(ToolError::NoRuns {
                    step: self.step.clone(),
                });
            };
            if self.runs.load(Ordering::Relaxed) >= self.limits.runs {
                return Err(ToolError::RunsSpent {
                    max: self.limits.runs,
                });
            }
            self.scratch_run(plan, change).await
        })
    }
}

fn failed(e: WorkTreeError) -> ToolError {
    ToolError::Failed {
        detail: crate::core::text::error_chain(&e),
    }
}

fn rejected(e: WorkTreeError) -> ToolError {
    ToolError::Rejected {
        violation: crate::core::text::error_chain(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::artifact::{FileChange, TestRunReceipt};
    use crate::core::protocol::{InfraError, PromoteReport, PromoteRequest};

    /// A Lakebase side that must never be reached: these tests make no scratch run.
    struct Unreachable;

    impl LakebaseEndpoint for Unreachable {
        fn verify(
            &self,
            _: VerifyRequest,
            _: Duration,
        ) -> BoxFuture<'_, Result<TestRunReceipt, crate::core::protocol::InfraError>> {
            Box::pin(async { panic!("a scratch run was asked for") })
        }

        fn promote(
            &self,
            _: PromoteRequest,
            _: Duration,
        ) -> BoxFuture<'_, Result<PromoteReport, InfraError>> {
            Box::pin(async { panic!("a promotion was asked for") })
        }
    }

    fn bench(root: &std::path::Path, limits: WorkbenchLimits) -> StepBench {
        StepBench {
            step: "review/T1/0".into(),
            work: WorkTree::open(root).expect("open"),
            policy: PathPolicy::default(),
            plan: None,
            lakebase: Arc::new(Unreachable),
            timeout: Duration::from_secs(1),
            limits,
            runs: AtomicU32::new(0),
            ids: Arc::default(),
            hidden: vec![root.join(crate::core::paths::STATE_DIR)],
        }
    }

    fn tree() -> (tempfile::TempDir, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        std::fs::create_dir_all(root.join("src")).expect("mkdir");
        std::fs::create_dir_all(root.join(".consort")).expect("mkdir");
        std::fs::write(root.join("src/a.sql"), "select 1;\n-- needle here\n").expect("seed");
        std::fs::write(root.join("src/big.txt"), "é".repeat(40)).expect("seed");
        std::fs::write(root.join(".consort/ledger.jsonl"), "{}\n").expect("seed");
        std::fs::write(outside.path().join("secret.txt"), "needle outside\n").expect("seed");
        (dir, outside)
    }

    #[test]
    fn reads_are_judged_by_the_file_a_path_reaches() {
        let (dir, outside) = tree();
        let root = dir.path();
        std::os::unix::fs::symlink(outside.path().join("secret.txt"), root.join("src/link.txt"))
            .expect("link out");
        std::os::unix::fs::symlink(root.join(".consort"), root.join("state")).expect("link in");
        let b = bench(root, WorkbenchLimits::default());
        assert_eq!(
            b.read("src/a.sql").expect("read").text,
            "select 1;\n-- needle here\n"
        );
        for path in [
            "../x",
            "/etc/passwd",
            "src/link.txt",
            "state/ledger.jsonl",
            ".consort/ledger.jsonl",
            "src",
        ] {
            let e = b.read(path).expect_err(path);
            assert!(matches!(e, ToolError::Refused { .. }), "{path}: {e}");
        }
        assert!(matches!(
            b.read("src/none.sql"),
            Err(ToolError::NotFound { .. })
        ));
    }

    #[test]
    fn reads_listings_and_searches_are_bounded() {
        let (dir, _outside) = tree();
        let limits = WorkbenchLimits {
            runs: 0,
            read_bytes: 9,
            hits: 1,
        };
        let b = bench(dir.path(), limits);
        // 9 bytes cut through the fifth 2-byte character: four characters come back.
        let f = b.read("src/big.txt").expect("read");
        assert_eq!(
            (f.text.chars().count(), f.truncated, f.bytes),
            (4, true, 80)
        );
        let listed = b.list(Some("src/*.sql")).expect("list");
        assert_eq!(listed.files, vec![("src/a.sql".to_string(), 25)]);
        assert!(matches!(b.list(Some("[")), Err(ToolError::BadPattern(_))));
        let hits = b.search("e", None).expect("search");
        assert_eq!(hits.hits.len(), 1);
        assert!(hits.more, "more lines match than one");
        let needle = b.search("needle", None).expect("search");
        assert_eq!(
            needle.hits.len(),
            1,
            "the ledger and the outside are not searched"
        );
        assert_eq!(
            (needle.hits[0].path.as_str(), needle.hits[0].line),
            ("src/a.sql", 2)
        );
    }

    #[tokio::test]
    async fn a_step_without_a_plan_or_runs_left_makes_no_run() {
        let (dir, _outside) = tree();
        let b = bench(dir.path(), WorkbenchLimits::default());
        let change = ChangeSet {
            summary: String::new(),
            changes: vec![FileChange::Delete {
                path: "src/a.sql".into(),
            }],
        };
        let e = b.try_change(change.clone()).await.expect_err("no plan");
        assert_eq!(e.to_string(), "step review/T1/0 cannot try changes");
        let green = crate::core::step::Step::Green { test: "T1".into() };
        let mut spent = bench(
            dir.path(),
            WorkbenchLimits {
                runs: 0,
                ..WorkbenchLimits::default()
            },
        );
        spent.plan =
            crate::core::machine::Machine::default().scratch_plan(&Default::default(), &green);
        assert!(spent.plan.is_some(), "GREEN may try changes");
        let e = spent.try_change(change).await.expect_err("no runs left");
        assert!(matches!(e, ToolError::RunsSpent { max: 0 }), "{e}");
        assert!(
            dir.path().join("src/a.sql").exists(),
            "the tree is untouched"
        );
    }
}
