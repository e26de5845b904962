use super::*;
use crate::core::artifact::{Artifact, ReviewVerdict};
use crate::core::protocol::AssignmentId;
use crate::core::role::ActorId;

fn usage(prompt: u64, completion: u64, wall_ms: u64, model: &str) -> Usage {
    Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        cached_tokens: prompt / 2,
        calls: 1,
        tool_calls: 0,
        wall_ms,
        model: Some(model.into()),
        ..Usage::default()
    }
}

fn produced(role: Role, u: Usage) -> Event {
    Event::Produced {
        assignment: AssignmentId(1),
        author: ActorId::new(role, role.as_str()),
        artifact: Artifact::ReviewVerdict(ReviewVerdict::Approve { notes: vec![] }),
        usage: u,
        transcript: None,
    }
}

fn failed(role: Option<Role>, u: Usage) -> Event {
    Event::AgentFailed {
        assignment: AssignmentId(2),
        failure: AgentFailure::InvalidOutput {
            attempts: 3,
            detail: "bad".into(),
            usage: u.clone(),
        },
        role,
        usage: u,
    }
}

#[test]
fn the_fold_sums_answers_and_failures_per_role_and_model() {
    let events = [
        produced(Role::Driver, usage(100, 20, 1000, "a")),
        produced(Role::Driver, usage(50, 10, 500, "b")),
        failed(Some(Role::Navigator), usage(30, 5, 200, "a")),
        // No role named (an older line) or nothing spent: counts nothing.
        failed(None, usage(999, 999, 999, "a")),
        produced(Role::Dba, Usage::default()),
        Event::Refused {
            violation: crate::core::machine::RuleViolation::NotHalted,
            run_output: None,
        },
    ];
    let t = usage_totals(&events);
    let driver = t.role(Role::Driver);
    assert_eq!(driver.steps, 2);
    assert_eq!(driver.tokens(), 180);
    assert_eq!(driver.cached_tokens, 75);
    assert_eq!(driver.wall_ms, 1500);
    assert_eq!(t.roles[&Role::Driver].by_model["b"].prompt_tokens, 50);
    assert_eq!(t.role(Role::Navigator).tokens(), 35);
    assert_eq!(t.role(Role::Dba), Tally::default());
    assert!(!t.roles.contains_key(&Role::Dba));
    let run = t.run();
    assert_eq!(
        (run.tokens(), run.calls, run.wall_ms, run.steps),
        (215, 3, 1700, 3)
    );
    assert_eq!(usage_totals(&[]), UsageTotals::default());
    // Money: priced per model; a model without a price costs nothing and is named.
    let prices = BTreeMap::from([(
        "a".to_string(),
        Price {
            prompt: 1_000_000,
            completion: 2_000_000,
            cached: 500_000,
        },
    )]);
    // Driver on a: 50 uncached × 1 + 50 cached × 0.5 + 20 × 2 = 115 millionths.
    assert_eq!(t.cost(&prices, Some(Role::Driver)), 115);
    // Navigator on a: 15 × 1 + 15 × 0.5 + 5 × 2 = 32.5, rounded up.
    assert_eq!(t.cost(&prices, None), 115 + 33);
    assert_eq!(t.unpriced(&prices), vec!["b".to_string()]);
}

#[test]
fn a_spent_budget_is_named_and_the_tightest_is_handed_on() {
    let events = [produced(Role::Driver, usage(400, 100, 2000, "a"))];
    let t = usage_totals(&events);
    let mut b = Budgets {
        run: Limits {
            tokens: Some(10_000),
            wall_ms: Some(60_000),
            money_micros: None,
        },
        ..Budgets::default()
    };
    b.roles.insert(
        Role::Driver,
        Limits {
            tokens: Some(500),
            ..Limits::default()
        },
    );
    assert!(!b.is_unlimited());
    let spent = b
        .remaining(&t, Role::Driver)
        .expect_err("driver tokens spent");
    assert_eq!(
        spent.budget,
        BudgetName {
            role: Some(Role::Driver),
            measure: Measure::Tokens
        }
    );
    assert_eq!(spent.to_string(), "driver tokens: 500 of 500 spent");
    let r = b
        .remaining(&t, Role::Navigator)
        .expect("navigator has budget left")
        .expect("the run's budget applies");
    let tokens = r.tokens.as_ref().expect("a token budget");
    assert_eq!((tokens.budget.role, tokens.left()), (None, 9500));
    assert_eq!(r.wall_ms.as_ref().map(Allowance::left), Some(58_000));
    assert_eq!(Budgets::default().remaining(&t, Role::Driver), Ok(None));
    // The run's budget spent stops every role.
    b.run.tokens = Some(500);
    let spent = b.remaining(&t, Role::Dba).expect_err("run spent");
    assert_eq!(spent.to_string(), "run tokens: 500 of 500 spent");
}

#[test]
fn a_call_that_would_go_over_is_refused_before_it_is_made() {
    let r = Remaining {
        tokens: Some(Allowance {
            budget: BudgetName {
                role: None,
                measure: Measure::Tokens,
            },
            limit: 1000,
            spent: 600,
        }),
        wall_ms: None,
        money_micros: None,
        prices: BTreeMap::new(),
    };
    let call = CallEstimate {
        prompt_tokens: CallEstimate::prompt_tokens_of_chars(801),
        max_completion_tokens: 100,
    };
    assert_eq!(call.prompt_tokens, 201);
    assert_eq!(r.check_call(&Usage::default(), None, call), Ok(()));
    // After 150 tokens spent earlier in the step, 301 more do not fit in the 250 left.
    let so_far = usage(100, 50, 0, "a");
    let e = r.check_call(&so_far, None, call).expect_err("over");
    assert_eq!(
        e.to_string(),
        "run tokens: 750 of 1000 spent, the next call needs about 301"
    );
    let wall = Remaining {
        wall_ms: Some(Allowance {
            budget: BudgetName {
                role: Some(Role::Driver),
                measure: Measure::WallTime,
            },
            limit: 5000,
            spent: 4000,
        }),
        tokens: None,
        ..r.clone()
    };
    assert_eq!(wall.wall_left_ms(&usage(0, 0, 500, "a")), Some(500));
    let mut slow = usage(0, 0, 1000, "a");
    assert!(wall.check_call(&slow, None, call).is_err());
    slow.wall_ms = 10;
    assert!(wall.check_call(&slow, None, call).is_ok());
    assert_eq!(
        wall.wall_spent(&slow).map(|s| s.to_string()),
        Some("driver wall time: 5 s of 5 s spent".to_string())
    );
}

#[test]
fn the_budget_spent_halt_is_typed_and_names_the_budget() {
    let spent = SpentBudget {
        budget: BudgetName {
            role: None,
            measure: Measure::Tokens,
        },
        limit: 500_000,
        spent: 500_000,
        needed: None,
    };
    let event = budget_spent_event(AssignmentId(4), Role::Driver, spent.clone());
    let Event::AgentFailed { failure, role, .. } = &event else {
        panic!("an agent failure");
    };
    assert_eq!(*role, Some(Role::Driver));
    assert_eq!(
        failure.escalation_reason(),
        crate::EscalationReason::BudgetSpent(spent.budget.clone())
    );
    assert_eq!(
        failure.to_string(),
        "budget spent: run tokens: 500000 of 500000 spent"
    );
    let json = serde_json::to_value(failure.escalation_reason()).expect("json");
    assert_eq!(
        json,
        serde_json::json!({"kind": "budget-spent", "cause": {"measure": "tokens"}})
    );
}

#[test]
fn money_is_priced_per_model_and_checked_before_a_call() {
    let prices = BTreeMap::from([(
        "a".to_string(),
        Price {
            prompt: 1_000_000,
            completion: 1_000_000,
            cached: 1_000_000,
        },
    )]);
    let b = Budgets {
        run: Limits {
            money_micros: Some(1000),
            ..Limits::default()
        },
        prices,
        ..Budgets::default()
    };
    assert!(b.has_money());
    // 900 tokens at 1 per million each: 900 millionths of the 1000 spent.
    let t = usage_totals(&[produced(Role::Driver, usage(800, 100, 0, "a"))]);
    let r = b
        .remaining(&t, Role::Driver)
        .expect("money left")
        .expect("a budget applies");
    assert_eq!(r.money_micros.as_ref().map(Allowance::left), Some(100));
    let small = CallEstimate {
        prompt_tokens: 50,
        max_completion_tokens: 50,
    };
    assert_eq!(r.check_call(&Usage::default(), Some("a"), small), Ok(()));
    let big = CallEstimate {
        prompt_tokens: 100,
        max_completion_tokens: 50,
    };
    let e = r
        .check_call(&Usage::default(), Some("a"), big)
        .expect_err("150 millionths do not fit in 100");
    assert_eq!(
        e.to_string(),
        "run money: 0.0009 of 0.001 spent, the next call needs about 0.00015"
    );
    // A model without a price cannot be priced before the call; the totals name it.
    assert_eq!(r.check_call(&Usage::default(), Some("b"), big), Ok(()));
    let t = usage_totals(&[produced(Role::Driver, usage(2000, 0, 0, "a"))]);
    let spent = b.remaining(&t, Role::Driver).expect_err("spent");
    assert_eq!(spent.budget.measure, Measure::Money);
}
