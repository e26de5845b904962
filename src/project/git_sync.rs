//! A project's run as git commits: the commits its ledger calls for, made at resume, at the end
//! of a run and live while it runs. Here rather than in `git.rs`, which knows repositories and
//! commits but no project.

use std::sync::Mutex;

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
/// makes each commit once).
#[derive(Debug)]
pub struct LiveSync {
    wake: Mutex<std::sync::mpsc::Sender<()>>,
}

impl LiveSync {
    /// Starts the syncing thread for `project` in `repo`; it ends when the observer is
    /// dropped.
    pub fn start(project: Project, repo: GitRepo) -> LiveSync {
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        std::thread::spawn(move || {
            while rx.recv().is_ok() {
                while rx.try_recv().is_ok() {}
                if let Err(e) = sync_project(&project, &repo, false) {
                    tracing::warn!(error = %consort_actors::error_chain(&e), "could not commit the run's steps yet; the next sync tries again");
                }
            }
        });
        LiveSync {
            wake: Mutex::new(tx),
        }
    }
}

impl consort_actors::AppendObserver for LiveSync {
    fn appended(&self, _index: u64) -> std::ops::ControlFlow<()> {
        if let Ok(tx) = self.wake.lock() {
            let _ = tx.send(());
        }
        std::ops::ControlFlow::Continue(())
    }
}
