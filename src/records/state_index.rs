//! The scheduler's index of where each feature stands, kept beside the chains: a feature's
//! state is replayed from its whole ledger once, and again only when the end of its chain
//! moved. Picking the next feature then reads one head per feature (one statement for all of
//! them with the shared store, one `stat` each with files) instead of every ledger.
//!
//! Invariant: a state is stored under the head read *before* its replay, so an entry appended
//! meanwhile makes the next look miss and replay again; a state is never kept under a head
//! newer than the entries it was replayed from.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use crate::backlog::FeatureState;

/// Where a feature's chain ends ([`Records::heads`](super::Records::heads)), with whether the
/// feature ran in a lane (its replay's configuration depends on it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ChainHead {
    pub(crate) end: String,
    pub(crate) in_lane: bool,
}

/// Each feature's last replayed state, by feature id, with the head it was replayed at.
#[derive(Debug, Default)]
pub(crate) struct StateIndex(Mutex<HashMap<String, (ChainHead, FeatureState)>>);

impl StateIndex {
    /// The state of `feature` replayed at `head`, if the index has it.
    pub(crate) fn get(&self, feature: &str, head: &ChainHead) -> Option<FeatureState> {
        let map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.get(feature)
            .filter(|(at, _)| at == head)
            .map(|(_, state)| *state)
    }

    /// Keeps `state`, replayed from entries read after `head` was.
    pub(crate) fn put(&self, feature: &str, head: ChainHead, state: FeatureState) {
        let mut map = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(feature.to_string(), (head, state));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(end: &str) -> ChainHead {
        ChainHead {
            end: end.into(),
            in_lane: false,
        }
    }

    #[test]
    fn a_state_is_found_only_at_the_head_it_was_replayed_at() {
        let index = StateIndex::default();
        assert_eq!(index.get("F1", &head("3:abc")), None);
        index.put("F1", head("3:abc"), FeatureState::Building);
        assert_eq!(
            index.get("F1", &head("3:abc")),
            Some(FeatureState::Building)
        );
        assert_eq!(index.get("F1", &head("4:def")), None, "the chain moved");
        assert_eq!(index.get("F2", &head("3:abc")), None, "another feature");
        let in_lane = ChainHead {
            in_lane: true,
            ..head("3:abc")
        };
        assert_eq!(index.get("F1", &in_lane), None, "its lane record appeared");
    }
}
