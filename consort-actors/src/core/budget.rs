//! Usage totals and budgets, derived from the ledger.
//!
//! Every [`Event::Produced`] and [`Event::AgentFailed`] records what its step cost
//! ([`Usage`]); [`usage_totals`] folds a ledger's events into totals per role and for the run.
//! That one fold feeds `consort status --json`, `consort log`, the end-of-run summary and the
//! budgets, so a resumed run continues from what its ledger says was spent.
//!
//! [`Budgets`] are limits per run and per role on tokens (prompt plus completion), wall time
//! (time spent in agent steps, as the ledger records it) and money (tokens priced by a
//! [`Price`] table per model). The conductor checks them **before** every assignment
//! ([`Budgets::remaining`]): a spent budget is not asked again, the step fails with
//! [`AgentFailure::BudgetSpent`] and the run halts with
//! [`EscalationReason::BudgetSpent`](crate::EscalationReason::BudgetSpent) naming the budget.
//! What is left travels in the assignment ([`Remaining`]), so a backend making several calls
//! for one step (retries, repairs, tool rounds) checks each call before it makes it
//! ([`Remaining::check_call`]).
//!
//! Everything here is pure: no clock, no I/O.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::machine::Event;
use crate::core::protocol::{AgentFailure, Usage};
use crate::core::role::Role;

key_type! {
    /// What a budget measures.
    #[serde(rename_all = "kebab-case")]
    pub enum Measure {
        /// Prompt plus completion tokens.
        Tokens,
        /// Milliseconds spent in agent steps.
        WallTime,
        /// Millionths of the price table's currency unit.
        Money,
    }
}

impl Measure {
    /// The measure's name, for people: `tokens`, `wall time`, `money`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Measure::Tokens => "tokens",
            Measure::WallTime => "wall time",
            Measure::Money => "money",
        }
    }

    /// An amount of this measure, for people: `1200`, `12.5 s`, `0.031245`.
    pub fn amount(&self, n: u64) -> String {
        match self {
            Measure::Tokens => n.to_string(),
            Measure::WallTime => format!("{} s", trim_decimal(n as f64 / 1000.0, 1)),
            Measure::Money => trim_decimal(n as f64 / 1_000_000.0, 6),
        }
    }
}

display_as_str!(Measure);

/// Which budget: the run's or a role's, and what it measures. Shows as `run tokens`,
/// `driver wall time`, …
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct BudgetName {
    /// The role whose budget it is; `None` for the whole run's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
    /// What it measures.
    pub measure: Measure,
}

impl fmt::Display for BudgetName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.role {
            Some(role) => write!(f, "{role} {}", self.measure),
            None => write!(f, "run {}", self.measure),
        }
    }
}

/// A budget that is spent, or that the next call would go over.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct SpentBudget {
    /// Which budget.
    pub budget: BudgetName,
    /// Its limit, in the measure's unit (tokens, milliseconds, millionths).
    pub limit: u64,
    /// What the ledger records as spent.
    pub spent: u64,
    /// What the call that was not made would have needed (estimated), when one was refused
    /// with budget left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needed: Option<u64>,
}

/// `run tokens: 500000 of 500000 spent`, or `driver tokens: 4000 of 5000 spent, the next call
/// needs about 1800`.
impl fmt::Display for SpentBudget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = self.budget.measure;
        write!(
            f,
            "{}: {} of {} spent",
            self.budget,
            m.amount(self.spent),
            m.amount(self.limit)
        )?;
        if let Some(n) = self.needed {
            write!(f, ", the next call needs about {}", m.amount(n))?;
        }
        Ok(())
    }
}

/// The price of a model's tokens, in millionths of the currency unit per million tokens (so
/// `2.5` per million is `2_500_000`).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub struct Price {
    /// Per million prompt tokens not served from the cache.
    pub prompt: u64,
    /// Per million completion tokens.
    pub completion: u64,
    /// Per million prompt tokens served from the cache.
    pub cached: u64,
}

impl Price {
    /// The cost of the tokens, in millionths: cached tokens at the cached price, the rest of
    /// the prompt at the prompt price, the completion at the completion price.
    pub fn cost(&self, prompt_tokens: u64, completion_tokens: u64, cached_tokens: u64) -> u64 {
        let cached = cached_tokens.min(prompt_tokens);
        let total = u128::from(prompt_tokens - cached) * u128::from(self.prompt)
            + u128::from(cached) * u128::from(self.cached)
            + u128::from(completion_tokens) * u128::from(self.completion);
        u64::try_from(total.div_ceil(1_000_000)).unwrap_or(u64::MAX)
    }
}

/// Limits of one scope (the run or a role); `None` is no limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Limits {
    /// Prompt plus completion tokens.
    pub tokens: Option<u64>,
    /// Milliseconds in agent steps.
    pub wall_ms: Option<u64>,
    /// Millionths of the price table's currency unit.
    pub money_micros: Option<u64>,
}

impl Limits {
    fn is_none(&self) -> bool {
        *self == Limits::default()
    }

    fn get(&self, m: Measure) -> Option<u64> {
        match m {
            Measure::Tokens => self.tokens,
            Measure::WallTime => self.wall_ms,
            Measure::Money => self.money_micros,
        }
    }
}

/// The budgets of a run: the run's limits, each role's, and the price table money is counted
/// with.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Budgets {
    /// Limits on the whole run.
    pub run: Limits,
    /// Limits per role.
    pub roles: BTreeMap<Role, Limits>,
    /// Prices per model name.
    pub prices: BTreeMap<String, Price>,
}

impl Budgets {
    /// Whether no limit is set at all.
    pub fn is_unlimited(&self) -> bool {
        self.run.is_none() && self.roles.values().all(Limits::is_none)
    }

    /// Whether a money budget is set anywhere.
    pub fn has_money(&self) -> bool {
        self.run.money_micros.is_some() || self.roles.values().any(|l| l.money_micros.is_some())
    }

    /// What is left for `role`'s next step, given what the ledger records as spent: the
    /// tightest of the run's and the role's budget per measure (`Ok(None)` when no budget
    /// applies), or the first budget that is already spent.
    pub fn remaining(
        &self,
        totals: &UsageTotals,
        role: Role,
    ) -> Result<Option<Remaining>, SpentBudget> {
        let role_limits = self.roles.get(&role).copied().unwrap_or_default();
        if self.run.is_none() && role_limits.is_none() {
            return Ok(None);
        }
        let run = totals.run();
        let mine = totals.role(role);
        let mut left = BTreeMap::new();
        for measure in [Measure::Tokens, Measure::WallTime, Measure::Money] {
            let scopes = [
                (
                    None,
                    self.run.get(measure),
                    &run,
                    totals.cost(&self.prices, None),
                ),
                (
                    Some(role),
                    role_limits.get(measure),
                    &mine,
                    totals.cost(&self.prices, Some(role)),
                ),
            ];
            let mut tightest: Option<Allowance> = None;
            for (scope, limit, tally, cost) in scopes {
                let Some(limit) = limit else { continue };
                let spent = match measure {
                    Measure::Tokens => tally.tokens(),
                    Measure::WallTime => tally.wall_ms,
                    Measure::Money => cost,
                };
                let a = Allowance {
                    budget: BudgetName {
                        role: scope,
                        measure,
                    },
                    limit,
                    spent,
                };
                if a.left() == 0 {
                    return Err(a.spent_budget(None));
                }
                if tightest.as_ref().is_none_or(|t| a.left() < t.left()) {
                    tightest = Some(a);
                }
            }
            if let Some(t) = tightest {
                left.insert(measure, t);
            }
        }
        Ok(Some(Remaining {
            tokens: left.remove(&Measure::Tokens),
            wall_ms: left.remove(&Measure::WallTime),
            money_micros: left.remove(&Measure::Money),
            prices: self.prices.clone(),
        }))
    }
}

/// One budget's limit and what is spent of it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Allowance {
    /// Which budget.
    pub budget: BudgetName,
    /// Its limit.
    pub limit: u64,
    /// Spent when the step was assigned.
    pub spent: u64,
}

impl Allowance {
    /// What is left.
    pub fn left(&self) -> u64 {
        self.limit.saturating_sub(self.spent)
    }

    /// This budget as spent, with `more` spent on top during the step and `needed` the call
    /// that was refused.
    fn spent_budget(&self, needed: Option<u64>) -> SpentBudget {
        SpentBudget {
            budget: self.budget.clone(),
            limit: self.limit,
            spent: self.spent,
            needed,
        }
    }
}

/// What the budgets leave for one step, handed to the agent in its assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Remaining {
    /// The tightest token budget.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens: Option<Allowance>,
    /// The tightest wall-time budget (milliseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wall_ms: Option<Allowance>,
    /// The tightest money budget (millionths).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub money_micros: Option<Allowance>,
    /// The price table, so a backend can price its next call.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub prices: BTreeMap<String, Price>,
}

/// The estimate of one call that has not been made yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CallEstimate {
    /// Prompt tokens it will send (estimate: characters / 4, rounded up).
    pub prompt_tokens: u64,
    /// The most completion tokens it may get back (its token limit; 0 when it has none).
    pub max_completion_tokens: u64,
}

impl CallEstimate {
    /// The prompt-token estimate of `chars` characters: one token per four characters,
    /// rounded up (a common rule of thumb for English text and JSON).
    pub fn prompt_tokens_of_chars(chars: usize) -> u64 {
        (chars as u64).div_ceil(4)
    }
}

impl Remaining {
    /// Whether a call estimated at `next`, by `model`, fits in what is left after `so_far`
    /// (spent earlier in this step): `Err` names the budget it would go over, and the call
    /// must not be made. Wall time is checked as "some left" (a call's duration is not known
    /// before; bound it with [`Remaining::wall_left_ms`]).
    pub fn check_call(
        &self,
        so_far: &Usage,
        model: Option<&str>,
        next: CallEstimate,
    ) -> Result<(), SpentBudget> {
        let needed = next
            .prompt_tokens
            .saturating_add(next.max_completion_tokens);
        if let Some(a) = &self.tokens {
            let spent = a.spent.saturating_add(so_far.tokens());
            if spent.saturating_add(needed) > a.limit {
                return Err(SpentBudget {
                    spent,
                    ..a.spent_budget(Some(needed))
                });
            }
        }
        if let Some(a) = &self.wall_ms {
            let spent = a.spent.saturating_add(so_far.wall_ms);
            if spent >= a.limit {
                return Err(SpentBudget {
                    spent,
                    ..a.spent_budget(None)
                });
            }
        }
        if let (Some(a), Some(price)) = (&self.money_micros, model.and_then(|m| self.prices.get(m)))
        {
            let spent = a.spent.saturating_add(price.cost(
                so_far.prompt_tokens,
                so_far.completion_tokens,
                so_far.cached_tokens,
            ));
            let cost = price.cost(next.prompt_tokens, next.max_completion_tokens, 0);
            if spent.saturating_add(cost) > a.limit {
                return Err(SpentBudget {
                    spent,
                    ..a.spent_budget(Some(cost))
                });
            }
        }
        Ok(())
    }

    /// Milliseconds of wall time left after `so_far`, when a wall-time budget applies.
    pub fn wall_left_ms(&self, so_far: &Usage) -> Option<u64> {
        self.wall_ms
            .as_ref()
            .map(|a| a.left().saturating_sub(so_far.wall_ms))
    }

    /// The failure that says the wall-time budget ran out during the step.
    pub fn wall_spent(&self, so_far: &Usage) -> Option<SpentBudget> {
        self.wall_ms.as_ref().map(|a| SpentBudget {
            spent: a.spent.saturating_add(so_far.wall_ms).max(a.limit),
            ..a.spent_budget(None)
        })
    }
}

/// Usage summed over steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Tally {
    /// Steps answered or failed with usage recorded.
    pub steps: u64,
    /// Model or program calls.
    pub calls: u64,
    /// Tool calls.
    pub tool_calls: u64,
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Completion tokens.
    pub completion_tokens: u64,
    /// Prompt tokens served from the cache.
    pub cached_tokens: u64,
    /// Milliseconds in agent steps.
    pub wall_ms: u64,
}

impl Tally {
    /// Prompt plus completion tokens.
    pub fn tokens(&self) -> u64 {
        self.prompt_tokens.saturating_add(self.completion_tokens)
    }

    fn add_usage(&mut self, u: &Usage) {
        self.steps += 1;
        self.calls = self.calls.saturating_add(u64::from(u.calls));
        self.tool_calls = self.tool_calls.saturating_add(u64::from(u.tool_calls));
        self.prompt_tokens = self.prompt_tokens.saturating_add(u.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(u.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(u.cached_tokens);
        self.wall_ms = self.wall_ms.saturating_add(u.wall_ms);
    }

    fn add(&mut self, o: &Tally) {
        self.steps += o.steps;
        self.calls = self.calls.saturating_add(o.calls);
        self.tool_calls = self.tool_calls.saturating_add(o.tool_calls);
        self.prompt_tokens = self.prompt_tokens.saturating_add(o.prompt_tokens);
        self.completion_tokens = self.completion_tokens.saturating_add(o.completion_tokens);
        self.cached_tokens = self.cached_tokens.saturating_add(o.cached_tokens);
        self.wall_ms = self.wall_ms.saturating_add(o.wall_ms);
    }

    /// `1234 tokens (1000 prompt, 200 cached, 234 completion), 3 calls, 12.5 s`, for people.
    pub fn line(&self) -> String {
        let mut out = format!(
            "{} tokens ({} prompt, {} cached, {} completion), {}",
            self.tokens(),
            self.prompt_tokens,
            self.cached_tokens,
            self.completion_tokens,
            crate::counted(self.calls, "call", "calls")
        );
        if self.tool_calls > 0 {
            let tools = crate::counted(self.tool_calls, "tool call", "tool calls");
            out.push_str(&format!(", {tools}"));
        }
        out.push_str(&format!(", {}", Measure::WallTime.amount(self.wall_ms)));
        out
    }
}

/// What one role spent, in total and per model.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RoleUsage {
    /// Everything the role spent.
    pub total: Tally,
    /// Per model that answered (steps whose model is unknown are under `""`).
    pub by_model: BTreeMap<String, Tally>,
}

/// What a run spent, per role (the run's total is their sum, [`UsageTotals::run`]).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct UsageTotals {
    /// Per role; roles that spent nothing are absent.
    pub roles: BTreeMap<Role, RoleUsage>,
}

impl UsageTotals {
    /// The whole run's total.
    pub fn run(&self) -> Tally {
        let mut t = Tally::default();
        for r in self.roles.values() {
            t.add(&r.total);
        }
        t
    }

    /// One role's total (zero when it spent nothing).
    pub fn role(&self, role: Role) -> Tally {
        self.roles.get(&role).map(|r| r.total).unwrap_or_default()
    }

    /// The cost in millionths of `role`'s usage (`None`: the whole run's), priced per model;
    /// usage of a model the table has no price for costs nothing (see [`UsageTotals::unpriced`]).
    pub fn cost(&self, prices: &BTreeMap<String, Price>, role: Option<Role>) -> u64 {
        self.roles
            .iter()
            .filter(|(r, _)| role.is_none_or(|want| want == **r))
            .flat_map(|(_, u)| &u.by_model)
            .filter_map(|(model, t)| {
                prices
                    .get(model)
                    .map(|p| p.cost(t.prompt_tokens, t.completion_tokens, t.cached_tokens))
            })
            .fold(0u64, u64::saturating_add)
    }

    /// Models that spent tokens but have no price in `prices` (`""`: the model is unknown).
    pub fn unpriced(&self, prices: &BTreeMap<String, Price>) -> Vec<String> {
        let mut out: Vec<String> = self
            .roles
            .values()
            .flat_map(|u| &u.by_model)
            .filter(|(m, t)| t.tokens() > 0 && !prices.contains_key(*m))
            .map(|(m, _)| m.clone())
            .collect();
        out.sort();
        out.dedup();
        out
    }

    fn record(&mut self, role: Role, usage: &Usage) {
        let entry = self.roles.entry(role).or_default();
        entry.total.add_usage(usage);
        entry
            .by_model
            .entry(usage.model.as_deref().unwrap_or_default().to_string())
            .or_default()
            .add_usage(usage);
    }
}

/// Folds a ledger's events into what the run spent per role: the usage of every
/// [`Event::Produced`] (an answer that was then refused cost its tokens too) and of every
/// [`Event::AgentFailed`] that names its role. Events without usage (older ledgers, scripted
/// agents) add nothing.
pub fn usage_totals<'a>(events: impl IntoIterator<Item = &'a Event>) -> UsageTotals {
    let mut totals = UsageTotals::default();
    for event in events {
        match event {
            Event::Produced { author, usage, .. } if !usage.is_zero() => {
                totals.record(author.role, usage);
            }
            Event::AgentFailed {
                role: Some(role),
                usage,
                ..
            } if !usage.is_zero() => totals.record(*role, usage),
            _ => {}
        }
    }
    totals
}

/// The event that records a step not assigned because a budget is spent: the run halts with
/// [`EscalationReason::BudgetSpent`](crate::EscalationReason::BudgetSpent).
pub(crate) fn budget_spent_event(
    assignment: crate::core::protocol::AssignmentId,
    role: Role,
    budget: SpentBudget,
) -> Event {
    Event::AgentFailed {
        assignment,
        failure: AgentFailure::BudgetSpent {
            budget,
            usage: Usage::default(),
        },
        role: Some(role),
        usage: Usage::default(),
    }
}

/// `x` with at most `places` decimals, trailing zeros dropped.
fn trim_decimal(x: f64, places: usize) -> String {
    let s = format!("{x:.places$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

#[cfg(test)]
mod tests;
