//! A project's run as git commits: the commits its ledger calls for, made at resume, at the end
//! of a run and live while it runs. Here rather than in `git.rs`, which knows repositories and
//! commits but no project.

use std::sync::mpsc::Sender;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use consort_actors::WorkTree;

use crate::git::{GitRepo, RunHistory, SyncReport};
use crate::project::{Project, ProjectError};

/// Makes the commits `project`'s ledger calls for that its branch lacks (see
/// [`GitRepo::sync`]).
pub(crate) fn sync_project(
    project: &Project,
    repo: &GitRepo,
    refresh: bool,
) -> Result<SyncReport, ProjectError> {
    let events = project.events()?;
    let machine = project.machine()?;
    let commits = consort_actors::step_commits(&machine, &events);
    let state = machine.replay(&events);
    let work = WorkTree::open(project.work_tree())
        .map_err(consort_actors::ConductorError::from)?
        .with_filter(machine.config().paths.tree_filter().clone());
    let history = RunHistory {
        feature: project.feature_id(),
        commits: &commits,
        state: &state,
        work: &work,
        migrations: machine.config().migration_files.as_ref(),
    };
    Ok(repo.sync(&history, refresh)?)
}

/// Commits while the run goes: told of every ledger append, it wakes a thread that syncs
/// (appends coalesce; the commits come from the ledger, so a sync that runs late or twice
/// makes each commit once). [`LiveSync::finish`] ends the thread and waits for it: the
/// ensemble does so when it shuts down, so no sync of the run outlives it (to race the final
/// sync for the private index, or a lane's worktree being removed).
#[derive(Debug)]
pub struct LiveSync {
    wake: Mutex<Option<Sender<()>>>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl LiveSync {
    /// Starts the syncing thread for `project` in `repo`; it ends at [`LiveSync::finish`], or
    /// unwaited for when the `LiveSync` is dropped. With a remote (`[git] remote`), each sync
    /// that made a commit pushes the feature's branch.
    pub fn start(project: Project, repo: GitRepo) -> LiveSync {
        let remote = project.remote();
        // Whether commits wait to be pushed (made by this sync, or left by a failed push).
        let mut unpushed = false;
        Self::spawn(move || {
            match sync_project(&project, &repo, false) {
                Err(e) => {
                    tracing::warn!(error = %consort_actors::error_chain(&e), "could not commit the run's steps yet; the next sync tries again");
                }
                Ok(report) => unpushed |= report.made > 0,
            }
            if let Some(remote) = remote.as_ref().filter(|_| unpushed) {
                if !project.still_holds() {
                    tracing::warn!(feature = %project.feature_id(), "not pushed: this process no longer holds the feature");
                    return;
                }
                match remote.push_lane(project.feature_id(), || project.still_holds()) {
                    Ok(()) => unpushed = false,
                    Err(e) => {
                        tracing::warn!(error = %consort_actors::error_chain(&e), "could not push the feature's branch yet; the next sync tries again")
                    }
                }
            }
        })
    }

    /// The thread that calls `sync` once per wake (wakes that come while it syncs coalesce).
    fn spawn(mut sync: impl FnMut() + Send + 'static) -> LiveSync {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            while rx.recv().is_ok() {
                while rx.try_recv().is_ok() {}
                sync();
            }
        });
        LiveSync {
            wake: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
        }
    }

    /// Ends the syncing thread once it has made the sync already asked for, and waits for it.
    /// Appends told of after this are not synced here (the next sync makes their commits).
    pub fn finish(&self) {
        drop(
            self.wake
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        let thread = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(thread) = thread
            && thread.join().is_err()
        {
            tracing::warn!("the thread that commits the run's steps panicked");
        }
    }
}

impl consort_actors::AppendObserver for LiveSync {
    fn appended(&self, _index: u64) -> std::ops::ControlFlow<()> {
        if let Ok(wake) = self.wake.lock()
            && let Some(tx) = wake.as_ref()
        {
            let _ = tx.send(());
        }
        std::ops::ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use std::ops::ControlFlow;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use consort_actors::AppendObserver;

    use super::LiveSync;

    #[test]
    fn finish_waits_for_the_sync_asked_for_and_nothing_syncs_after_it() {
        let synced = Arc::new(AtomicUsize::new(0));
        let counter = Arc::clone(&synced);
        let live = LiveSync::spawn(move || {
            // A slow sync: finish must wait for it, not return while it is under way.
            std::thread::sleep(Duration::from_millis(200));
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_eq!(live.appended(1), ControlFlow::Continue(()));
        live.finish();
        assert_eq!(synced.load(Ordering::SeqCst), 1, "the asked sync was made");
        // Told of an append after it ended, it makes no sync, and finishing again is harmless.
        assert_eq!(live.appended(2), ControlFlow::Continue(()));
        live.finish();
        assert_eq!(synced.load(Ordering::SeqCst), 1, "no sync after finish");
    }
}
