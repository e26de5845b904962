//! `[budget]`: limits on what a run and its roles may spend, and the price table.
//!
//! ```toml
//! [budget]                     # the whole run
//! tokens = 2000000             # prompt + completion tokens
//! wall_secs = 7200             # seconds spent in agent steps
//! money = 20.0                 # in the price table's currency
//!
//! [budget.roles.driver]        # one role
//! tokens = 800000
//!
//! [budget.prices."gpt-4o-mini"]  # per million tokens
//! prompt = 0.15
//! completion = 0.60
//! cached = 0.075
//! ```
//!
//! Every budget is derived from the ledger (see `consort_actors::usage_totals`), so a resumed
//! run continues from what was spent, and is checked before every call. A role's
//! `budget = { max_tokens, max_wall_secs }` in its OpenAI configuration (the form earlier
//! versions wrote) is read as that role's budget here.

use std::collections::BTreeMap;

use consort_actors::{Budgets, Limits, Price, Role};
use consort_agents::AgentConfig;
use serde::{Deserialize, Serialize};

/// The defaults `consort run --agents openai` starts with when `consort.toml` sets no budget.
pub const OPENAI_DEFAULT_TOKENS: u64 = 2_000_000;
/// The default run wall time of `--agents openai`, in seconds (two hours).
pub const OPENAI_DEFAULT_WALL_SECS: u64 = 7200;
/// The default per-role token budget of `--agents openai`.
pub const OPENAI_DEFAULT_ROLE_TOKENS: u64 = 800_000;

/// `[budget]`: the run's limits, per-role limits and prices.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BudgetConfig {
    /// Prompt plus completion tokens the whole run may spend.
    pub tokens: Option<u64>,
    /// Seconds the whole run may spend in agent steps.
    pub wall_secs: Option<u64>,
    /// Money the whole run may spend, priced by `prices`.
    pub money: Option<f64>,
    /// Limits per role, keyed by role name.
    pub roles: BTreeMap<String, LimitsConfig>,
    /// Prices per model name, per million tokens.
    pub prices: BTreeMap<String, PriceConfig>,
}

/// `[budget.roles.<role>]`: one role's limits.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Prompt plus completion tokens.
    pub tokens: Option<u64>,
    /// Seconds in agent steps.
    pub wall_secs: Option<u64>,
    /// Money, priced by `[budget.prices]`.
    pub money: Option<f64>,
}

/// `[budget.prices.<model>]`: prices per million tokens.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PriceConfig {
    /// Per million prompt tokens not served from the cache.
    pub prompt: f64,
    /// Per million completion tokens.
    pub completion: f64,
    /// Per million prompt tokens served from the cache (default: the prompt price).
    pub cached: Option<f64>,
}

/// Millionths of an amount, refusing what is negative or not a number.
fn micros(key: &str, x: f64) -> Result<u64, (String, String)> {
    if !x.is_finite() || !(0.0..=1e12).contains(&x) {
        return Err((key.to_string(), "must be a number from 0 to 10^12".into()));
    }
    Ok((x * 1_000_000.0).round() as u64)
}

impl LimitsConfig {
    fn limits(&self, key: &str) -> Result<Limits, (String, String)> {
        Ok(Limits {
            tokens: self.tokens,
            wall_ms: self.wall_secs.map(|s| s.saturating_mul(1000)),
            money_micros: self
                .money
                .map(|m| micros(&format!("{key}.money"), m))
                .transpose()?,
        })
    }
}

impl BudgetConfig {
    /// Whether the table sets any limit.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_none()
            && self.wall_secs.is_none()
            && self.money.is_none()
            && self.roles.is_empty()
    }

    /// The budgets, with a role's legacy `budget = { max_tokens, max_wall_secs }` of its
    /// OpenAI configuration taken as its limit (the tighter of the two when both are set).
    /// `Err` names the key and what is wrong.
    pub fn budgets(
        &self,
        agent_for: impl Fn(Role) -> AgentConfig,
    ) -> Result<Budgets, (String, String)> {
        let run = LimitsConfig {
            tokens: self.tokens,
            wall_secs: self.wall_secs,
            money: self.money,
        }
        .limits("budget")?;
        let mut roles = BTreeMap::new();
        for (name, l) in &self.roles {
            let key = format!("budget.roles.{name}");
            let role: Role = name.parse().map_err(|e| (key.clone(), format!("{e}")))?;
            roles.insert(role, l.limits(&key)?);
        }
        for role in Role::ALL {
            if let AgentConfig::Openai(cfg) = agent_for(role) {
                let legacy = Limits {
                    tokens: cfg.budget.max_tokens,
                    wall_ms: cfg.budget.max_wall_secs.map(|s| s.saturating_mul(1000)),
                    money_micros: None,
                };
                let mine = roles.entry(role).or_default();
                mine.tokens = tighter(mine.tokens, legacy.tokens);
                mine.wall_ms = tighter(mine.wall_ms, legacy.wall_ms);
            }
        }
        roles.retain(|_, l| *l != Limits::default());
        let mut prices = BTreeMap::new();
        for (model, p) in &self.prices {
            let key = format!("budget.prices.{model}");
            prices.insert(
                model.clone(),
                Price {
                    prompt: micros(&format!("{key}.prompt"), p.prompt)?,
                    completion: micros(&format!("{key}.completion"), p.completion)?,
                    cached: micros(&format!("{key}.cached"), p.cached.unwrap_or(p.prompt))?,
                },
            );
        }
        let money = run.money_micros.is_some() || roles.values().any(|l| l.money_micros.is_some());
        if money && prices.is_empty() {
            return Err((
                "budget.money".into(),
                "a money budget needs a price table: add [budget.prices.\"<model>\"]".into(),
            ));
        }
        Ok(Budgets { run, roles, prices })
    }
}

fn tighter(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// The budgets `consort run --agents openai` starts with when `consort.toml` sets none:
/// [`OPENAI_DEFAULT_TOKENS`] tokens and [`OPENAI_DEFAULT_WALL_SECS`] seconds for the run, and
/// [`OPENAI_DEFAULT_ROLE_TOKENS`] tokens for each role.
pub fn openai_default_budgets() -> Budgets {
    let role = Limits {
        tokens: Some(OPENAI_DEFAULT_ROLE_TOKENS),
        ..Limits::default()
    };
    Budgets {
        run: Limits {
            tokens: Some(OPENAI_DEFAULT_TOKENS),
            wall_ms: Some(OPENAI_DEFAULT_WALL_SECS * 1000),
            money_micros: None,
        },
        roles: Role::ALL.into_iter().map(|r| (r, role)).collect(),
        prices: BTreeMap::new(),
    }
}

/// The budgets in lines for people: `run: 2000000 tokens, 7200 s`, `driver: 800000 tokens`.
pub fn budget_lines(b: &Budgets) -> Vec<String> {
    use consort_actors::Measure;
    let line = |l: &Limits| {
        let mut parts = Vec::new();
        if let Some(t) = l.tokens {
            parts.push(format!("{t} tokens"));
        }
        if let Some(w) = l.wall_ms {
            parts.push(Measure::WallTime.amount(w));
        }
        if let Some(m) = l.money_micros {
            parts.push(format!("{} money", Measure::Money.amount(m)));
        }
        parts.join(", ")
    };
    let mut out = Vec::new();
    if b.run != Limits::default() {
        out.push(format!("run: {}", line(&b.run)));
    }
    // Roles with the same limits are said once.
    let mut same: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for (role, l) in &b.roles {
        same.entry(line(l)).or_default().push(role.as_str());
    }
    for (text, roles) in same {
        let who = if roles.len() == Role::ALL.len() {
            "each role".to_string()
        } else {
            roles.join(", ")
        };
        out.push(format!("{who}: {text}"));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budgets_parse_with_prices_and_legacy_role_limits() {
        let text = r#"
            tokens = 1000
            wall_secs = 60
            money = 0.5
            [roles.driver]
            tokens = 300
            [prices.m]
            prompt = 1.0
            completion = 2.0
        "#;
        let cfg: BudgetConfig = toml::from_str(text).expect("parses");
        let mut openai = consort_agents::OpenAiConfig::new("http://127.0.0.1:9/v1", "m");
        openai.budget.max_tokens = Some(200);
        openai.budget.max_wall_secs = Some(5);
        let b = cfg
            .budgets(|r| {
                if r == Role::Driver || r == Role::Navigator {
                    AgentConfig::Openai(openai.clone())
                } else {
                    AgentConfig::Script {
                        path: None,
                        paths: vec![],
                    }
                }
            })
            .expect("valid");
        assert_eq!(b.run.tokens, Some(1000));
        assert_eq!(b.run.wall_ms, Some(60_000));
        assert_eq!(b.run.money_micros, Some(500_000));
        assert_eq!(b.roles[&Role::Driver].tokens, Some(200), "the tighter one");
        assert_eq!(b.roles[&Role::Navigator].wall_ms, Some(5000));
        assert!(!b.roles.contains_key(&Role::SpecAuthor));
        assert_eq!(b.prices["m"].cached, 1_000_000, "cached defaults to prompt");
        let lines = budget_lines(&b);
        assert_eq!(lines[0], "run: 1000 tokens, 60 s, 0.5 money");
    }

    #[test]
    fn bad_budgets_are_named() {
        let cfg: BudgetConfig = toml::from_str("money = 1.0").expect("parses");
        let none = |_| AgentConfig::Script {
            path: None,
            paths: vec![],
        };
        assert_eq!(cfg.budgets(none).expect_err("no prices").0, "budget.money");
        let cfg: BudgetConfig = toml::from_str("[roles.drivr]\ntokens = 1").expect("parses");
        assert_eq!(
            cfg.budgets(none).expect_err("bad role").0,
            "budget.roles.drivr"
        );
        let cfg: BudgetConfig =
            toml::from_str("[prices.m]\nprompt = -1.0\ncompletion = 1.0").expect("parses");
        assert!(cfg.budgets(none).is_err());
        assert!(toml::from_str::<BudgetConfig>("tokenz = 1").is_err());
    }

    #[test]
    fn the_openai_defaults_read_in_a_few_lines() {
        assert_eq!(
            budget_lines(&openai_default_budgets()),
            vec![
                "run: 2000000 tokens, 7200 s".to_string(),
                "each role: 800000 tokens".to_string()
            ]
        );
    }
}
