//! The conductor's side of the budgets: checked against the ledger before every assignment,
//! and the usage of a failed step recorded with the conductor's own wall time.
//!
//! The rules themselves (the fold, the limits, what is left) are pure and live in
//! `crate::core::budget`; this module only feeds them the ledger the conductor holds.

use std::time::Duration;

use super::ConductorState;
use crate::core::budget::{Remaining, budget_spent_event, usage_totals};
use crate::core::machine::Event;
use crate::core::protocol::{AgentFailure, AssignmentId};
use crate::core::role::Role;

/// What the budgets leave for `role`'s next step (`Ok(None)`: no budget applies), or the
/// event that records the step as not assigned because a budget is spent (the run halts on
/// it). Derived from the whole ledger, so a resumed run continues from what was spent.
pub(super) fn before_assign(
    st: &ConductorState,
    id: AssignmentId,
    role: Role,
) -> Result<Option<Remaining>, Box<Event>> {
    let budgets = &st.wiring.config.budgets;
    if budgets.is_unlimited() {
        return Ok(None);
    }
    let totals = usage_totals(st.ledger.entries().iter().map(|e| &e.event));
    if budgets.has_money() {
        let unpriced = totals.unpriced(&budgets.prices);
        if !unpriced.is_empty() {
            tracing::warn!(
                models = %unpriced.join(", "),
                "a money budget is set but these models have no price in [budget.prices]; their tokens cost nothing"
            );
        }
    }
    match budgets.remaining(&totals, role) {
        Ok(remaining) => Ok(remaining),
        Err(spent) => {
            tracing::warn!(%role, budget = %spent, "budget spent; the step is not assigned");
            Err(Box::new(budget_spent_event(id, role, spent)))
        }
    }
}

/// The event of a failed step: the agent's reported usage, with the wall time the conductor
/// measured when that is longer (a timed-out or crashed step reports none itself).
pub(super) fn failed(
    id: AssignmentId,
    role: Role,
    failure: AgentFailure,
    elapsed: Duration,
) -> Event {
    let mut usage = failure.usage();
    let measured = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
    usage.wall_ms = usage.wall_ms.max(measured);
    Event::AgentFailed {
        assignment: id,
        failure,
        role: Some(role),
        usage,
    }
}
