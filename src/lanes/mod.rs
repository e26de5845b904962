//! Lanes: several features of a backlog at once, each in its own git worktree on its own branch
//! `consort/<id>`, with its own conductor, ledger and database branches.
//!
//! A lane's worktree is `<repository>.consort-lanes/<id>` beside the repository, outside the
//! project's tree where none of its tools looks ([`lanes_dir`]; made from the branch the
//! project's tree is on, its *base*, recorded in `lane.json` beside the feature's ledger). It
//! is a whole workspace: the dependency folders installed in the project's tree
//! (`node_modules`, `.venv`) are linked into it, read-only to its runs (`deps`). Its records
//! stay where every feature's are, in `.consort/features/<id>/`, outside the worktree, so no
//! agent and no test run of the lane reaches them. One process holds a feature at a time (its lock,
//! `feature.lock`); the lanes of one process share the branch provider and split the warm pool.
//!
//! **Invariants:**
//! - A lane is done only when its promotion passed the merge check (`merge`): its branch,
//!   merged with what reached the base since it started, passes the tests of every merged
//!   feature; a git conflict or a migration on an object a merged feature's migration touches
//!   halts it with both sides named. Merges are one at a time (`.consort/merge.lock`).
//! - Nothing but git and the features' records is shared between processes: two processes
//!   drive two features of one project side by side.
//! - A lane's test runs read no other lane's workspace, one made after they started included:
//!   the lanes' directory is hidden from every run but for the run's own tree
//!   ([`hidden_from_lane`]).
//! - A lane's worktree is removed when its feature is done or stopped; a killed run's lane is
//!   found again by its directory and resumed where its ledger stopped.

mod deps;
mod drive;
mod merge;
mod objects;
mod worktree;

impl crate::project::Project {
    /// Removes this handle's lane worktree, when it is a lane's (its branch and records
    /// stay): what `consort stop` does once the stop is recorded and the unverified work put
    /// back, so that a stopped lane does not wait for the next run to be cleared. `false`:
    /// there was none.
    pub fn remove_lane_worktree(&self) -> Result<bool, crate::project::ProjectError> {
        if !self.in_lane() {
            return Ok(false);
        }
        Ok(worktree::remove(&self.dir, self.feature_entry())?)
    }
}

pub(crate) use crate::project::lane::legacy_lane_root;
pub use crate::project::lane::{LaneError, hidden_from_lane, lanes_dir, work_tree_of};
pub use deps::{editable_installs, link_dependencies};
pub use drive::{LaneOptions, LaneReport, run_lanes};
pub use merge::MergeCheck;
pub use worktree::{LaneRecord, ScratchLane};
