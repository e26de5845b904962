//! The work a stopped run leaves that no run verified (a GREEN that failed, the repairs a run
//! halted after), and putting back what the last verified step left.
//!
//! What to put back is the conductor's own record: the undo of every change set it applied,
//! kept in the ledger with the `Applied` event ([`consort_actors::unverified`]). It is written
//! only when the tree is exactly as the last applied change set left it (its hash is the one
//! recorded then): a file someone changed by hand since is never overwritten.

use consort_actors::{ChangeSet, ConductorError, FileChange, WorkTree};

use crate::project::{Project, ProjectError};

/// What a stopped run leaves in the work tree beyond its last verified step.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnverifiedWork {
    /// The last verified step (`green/T2`), None before the first.
    pub last_verified: Option<String>,
    /// The paths that differ from what the last verified step left, each with how.
    pub differs: Vec<(String, Difference)>,
    /// Whether the tree is exactly as the run's last applied change set left it, so the undo
    /// can be written without overwriting anyone's edit.
    pub untouched_since: bool,
    undo: ChangeSet,
}

/// How a path differs from what the last verified step left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Difference {
    /// The step left a file there that is now different or gone.
    Changed,
    /// The step left no file there.
    New,
}

impl std::fmt::Display for Difference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Difference::Changed => "changed",
            Difference::New => "new",
        })
    }
}

impl Project {
    /// The work the feature's run applied after its last verified step that the tree still
    /// holds.
    pub fn unverified_work(&self) -> Result<UnverifiedWork, ProjectError> {
        let events = self.events()?;
        let machine = self.machine()?;
        let found = consort_actors::unverified(&machine, &events);
        let work = WorkTree::open(self.work_tree())
            .map_err(ConductorError::from)?
            .with_filter(machine.config().paths.tree_filter().clone());
        let mut differs = Vec::new();
        let mut undo = Vec::new();
        for change in found.undo {
            if let Some(how) = difference(&work, &change) {
                differs.push((change.path().to_string(), how));
                undo.push(change);
            }
        }
        let last_applied = events.iter().rev().find_map(|e| match e {
            consort_actors::Event::Applied { workspace_hash, .. } => Some(*workspace_hash),
            _ => None,
        });
        let now = work.hash().map_err(ConductorError::from)?;
        Ok(UnverifiedWork {
            last_verified: found.last_verified,
            differs,
            untouched_since: last_applied == Some(now),
            undo: ChangeSet {
                summary: "put back what the last verified step left".into(),
                changes: undo,
            },
        })
    }

    /// Writes back what the last verified step left, when the tree is untouched since the run's
    /// last change ([`UnverifiedWork::untouched_since`]); returns whether it did.
    pub fn put_back_verified(&self, work: &UnverifiedWork) -> Result<bool, ProjectError> {
        if !work.untouched_since || work.undo.changes.is_empty() {
            return Ok(false);
        }
        WorkTree::open(self.work_tree())
            .and_then(|tree| tree.apply(&work.undo))
            .map_err(ConductorError::from)?;
        Ok(true)
    }
}

impl Project {
    /// With the shared store, a feature taken over from another machine: when the tree holds
    /// what the last verified step left but not what the run applied after it (that was on the
    /// other machine's disk only), writes what was applied, from the ledger, so the tree is
    /// the one the run stood on. A tree that holds anything else is left for the machine to
    /// judge. Returns whether it wrote.
    pub(crate) fn restore_applied(&self) -> Result<bool, ProjectError> {
        if self.records().store().is_none() {
            return Ok(false);
        }
        let events = self.events()?;
        let machine = self.machine()?;
        let found = consort_actors::unverified(&machine, &events);
        if found.applied.is_empty() {
            return Ok(false);
        }
        let work = WorkTree::open(self.work_tree())
            .map_err(ConductorError::from)?
            .with_filter(machine.config().paths.tree_filter().clone());
        let last_applied = events.iter().rev().find_map(|e| match e {
            consort_actors::Event::Applied { workspace_hash, .. } => Some(*workspace_hash),
            _ => None,
        });
        if last_applied == Some(work.hash().map_err(ConductorError::from)?)
            || found.undo.iter().any(|u| difference(&work, u).is_some())
        {
            return Ok(false);
        }
        work.apply(&ChangeSet {
            summary: "what the run applied after its last verified step".into(),
            changes: found.applied,
        })
        .map_err(ConductorError::from)?;
        Ok(true)
    }
}

/// How the file `undo` would put back differs from the disk, if it does.
fn difference(work: &WorkTree, undo: &FileChange) -> Option<Difference> {
    let on_disk = std::fs::read(work.root().join(undo.path())).ok();
    match (undo, on_disk) {
        (FileChange::Delete { .. }, None) => None,
        (FileChange::Delete { .. }, Some(_)) => Some(Difference::New),
        (_, None) => Some(Difference::Changed),
        (change, Some(bytes)) => match change.bytes() {
            Some(left) if left.as_ref() == bytes.as_slice() => None,
            _ => Some(Difference::Changed),
        },
    }
}
