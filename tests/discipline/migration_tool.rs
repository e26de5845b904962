//! Cases 32–34: the project's own migration tool applies the migrations, and the design's
//! migration files in its folder are as frozen as SQL files Consort applies itself. The tool
//! here is a real one of the generic `command` form: a shell loop that applies each `.sql` file
//! of `db/migrations` with psql, once, and records it in `applied_migrations`. The honest
//! fixture runs to done under it (the control), with every RED and GREEN on a branch the tool
//! built; each case refuses one way around it.

use super::*;

/// The tool's folder (harness, as `[migrations] dir` makes it).
const DIR: &str = "db/migrations";

/// The design's migration, as the tool's folder holds it.
const DESIGN_FILE: &str = "db/migrations/0001_S1_items.sql";

/// Applies each file of the folder not yet recorded, in name order, each in one transaction
/// with its record.
const APPLY: &str = r#"set -e
psql -XqAt -v ON_ERROR_STOP=1 -c 'CREATE TABLE IF NOT EXISTS applied_migrations (name text PRIMARY KEY)'
for f in db/migrations/*.sql; do
  [ -e "$f" ] || continue
  n=$(basename "$f" .sql)
  if [ -z "$(psql -XqAt -c "SELECT 1 FROM applied_migrations WHERE name = '$n'")" ]; then
    psql -Xq -v ON_ERROR_STOP=1 --single-transaction -f "$f" -c "INSERT INTO applied_migrations VALUES ('$n')"
  fi
done
"#;

/// The machine of a case: the tool's folder is harness and holds the design's files.
fn machine_with_tool(max_agent_retries: u32) -> MachineConfig {
    MachineConfig {
        paths: consort::actors::PathPolicy::new(&["tests/**"], &[&format!("{DIR}/**")])
            .expect("the globs compile"),
        migration_files: Some(consort::actors::MigrationFiles {
            dir: DIR.into(),
            apply_existing: false,
            promote_existing: false,
            lane: None,
            tool: Some(consort::actors::ToolFormat {
                name: "command".into(),
                extension: "sql".into(),
                recorded: consort::actors::Recorded::Stem,
            }),
        }),
        ..machine(max_agent_retries, 1)
    }
}

/// The tool, as the verifier runs it.
fn tool() -> consort::lakebase::migrate::MigrationTool {
    consort::lakebase::migrate::MigrationTool {
        name: "command".into(),
        apply: APPLY.into(),
        applied: "SELECT name FROM applied_migrations".into(),
        env: consort::lakebase::EnvPolicy::default(),
        timeout: Duration::from_secs(60),
    }
}

/// The case's ensemble with the tool (see [`Case::ensemble`]), on a parent database of its
/// own: the other cases promote their migration into the shared one, which the tool's
/// bookkeeping there does not hold.
async fn with_tool(case: &Case, world: &World, cheats: &str) -> EnsembleBuilder {
    let parent = consort_testkit::cluster::unique_database("tool_parent");
    case.ensemble(world, cheats)
        .provider(consort_testkit::cluster::provider_on(&parent).await)
        .migration_tool(Some(tool()))
}

pub(super) const CASES: [&str; 3] = [
    "32 the Driver adds or edits a migration in the tool's folder, or the tool's configuration",
    "33 a RED whose test file is a migration",
    "34 a migration changed on disk before the promotion",
];

pub(super) async fn case(number: usize, world: &World) -> String {
    match number {
        32 => driver_writes_the_tools_folder(world).await,
        33 => red_test_written_as_a_migration(world).await,
        34 => migration_changed_before_the_promotion(world).await,
        other => panic!("no case {other}"),
    }
}

/// 32. The Driver's GREEN adds a migration of its own to the tool's folder, then rewrites the
///     design's file there, then reaches the folder through `..`, then rewrites the
///     configuration that names the tool and its command.
async fn driver_writes_the_tools_folder(world: &World) -> String {
    let case = Case::new(machine_with_tool(3));
    let cheats = [
        green_cheat(
            world,
            0,
            &[(
                "db/migrations/0002_extra.sql",
                "ALTER TABLE items DROP CONSTRAINT items_qty_check;\n",
            )],
        ),
        green_cheat(
            world,
            1,
            &[(
                DESIGN_FILE,
                "CREATE TABLE items (sku text PRIMARY KEY, qty integer);\n",
            )],
        ),
        green_cheat(
            world,
            2,
            &[("db/migrations/../migrations/0003.sql", "SELECT 1;\n")],
        ),
        green_cheat(
            world,
            3,
            &[(
                "consort.toml",
                "[migrations]\ntool = \"command\"\napply = \"true\"\napplied = \"SELECT '0001_S1_items'\"\n",
            )],
        ),
    ]
    .concat();
    let (_, events, seen) = case
        .refused(with_tool(&case, world, &cheats).await, "green/T1")
        .await;
    let refused = refusals(&events);
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert!(
        refused.iter().all(|r| matches!(
            r,
            RuleViolation::TouchesHarness { .. } | RuleViolation::PathOutsideWorkTree { .. }
        )),
        "{refused:?}"
    );
    assert_only_t1_red_ran(&seen);
    case.assert_not_written(&[
        "consort.toml",
        "db/migrations/0002_extra.sql",
        "db/migrations/0003.sql",
        CODE,
    ]);
    let frozen = case.file(DESIGN_FILE).expect("the design's migration file");
    assert!(frozen.contains("CHECK (qty >= 0)"), "{frozen}");
    "TouchesHarness for a new migration, the design's migration rewritten, a path into the folder and consort.toml; halted at green/T1".into()
}

/// 33. The Navigator's RED writes its test, and beside it the same test as a migration in the
///     tool's folder (which every run would apply before the tests).
async fn red_test_written_as_a_migration(world: &World) -> String {
    let case = Case::new(machine_with_tool(1));
    let t1 = honest_file(world, "red/T1", T1);
    let cheats = keeps_cheating(
        "red/T1",
        "T1, and T1 again where the tool runs it",
        &[(T1, Some(&t1)), ("db/migrations/0002_t1.sql", Some(&t1))],
    );
    let (_, events, seen) = case
        .refused(with_tool(&case, world, &cheats).await, "red/T1")
        .await;
    let refused = refusals(&events);
    assert!(
        !refused.is_empty()
            && refused.iter().all(|r| *r
                == RuleViolation::TouchesHarness {
                    path: "db/migrations/0002_t1.sql".into()
                }),
        "{refused:?}"
    );
    assert!(accepted_receipts(&seen).is_empty(), "no RED was accepted");
    case.assert_not_written(&["db/migrations/0002_t1.sql", T1]);
    "TouchesHarness (db/migrations/0002_t1.sql); halted at red/T1".into()
}

/// Approves every gate as "ada", but first rewrites the design's migration file on disk when
/// the promotion gate asks: what someone (or something) did to the tree after the deploy run.
struct TamperAtPromotion {
    file: PathBuf,
}

impl consort::Approver for TamperAtPromotion {
    fn decide<'a>(&'a self, request: &'a GateRequest) -> BoxFuture<'a, Option<GateApproval>> {
        Box::pin(async move {
            if request.gate == GateKind::Promote {
                std::fs::write(
                    &self.file,
                    "CREATE TABLE items (sku text PRIMARY KEY, qty integer);\nDROP TABLE IF EXISTS applied_migrations;\n",
                )
                .expect("tamper with the migration");
            }
            ApproveAs { name: "ada".into() }.decide(request).await
        })
    }
}

/// 34. The design's migration file is changed on disk after the deploy run, before the
///     promotion: the promotion applies nothing, and the run halts naming the file.
async fn migration_changed_before_the_promotion(world: &World) -> String {
    let case = Case::new(machine_with_tool(1));
    let builder = with_tool(&case, world, "")
        .await
        .approver(Arc::new(TamperAtPromotion {
            file: case.work.join(DESIGN_FILE),
        }));
    let report = run_once(builder).await;
    let events = case.events();
    assert!(
        !events.iter().any(|e| matches!(e, Event::Promoted { .. })),
        "nothing was promoted"
    );
    assert!(
        matches!(report.outcome, RunOutcome::Halted { .. }),
        "{:?}",
        report.outcome
    );
    let said = format!("{:?}", report.outcome);
    assert!(
        said.contains(DESIGN_FILE),
        "the run names the changed file: {said}"
    );
    format!("halted before the promotion, naming {DESIGN_FILE}")
}

/// The control: the honest fixture runs to done with the tool applying its migration on every
/// branch and at promotion, where the tool records it.
pub(super) async fn honest_run_finishes(world: &World) {
    let case = Case::new(machine_with_tool(1));
    let (report, events, _) = case.run(with_tool(&case, world, "").await).await;
    assert!(
        matches!(report.outcome, RunOutcome::Done),
        "{:?}",
        report.outcome
    );
    let promoted = events
        .iter()
        .find_map(|e| match e {
            Event::Promoted { report } => Some(report.clone()),
            _ => None,
        })
        .expect("promoted");
    assert_eq!(promoted.applied, ["0001_items"]);
    assert!(promoted.verified);
    assert_eq!(
        case.file(DESIGN_FILE).as_deref(),
        Some(honest_schema_sql(world).as_str())
    );
}

/// The honest plan's migration.
fn honest_schema_sql(world: &World) -> String {
    world
        .honest
        .entries()
        .iter()
        .find_map(|e| match &e.artifact {
            Artifact::SchemaPlan(plan) => Some(plan.migrations[0].sql.clone()),
            _ => None,
        })
        .expect("the honest plan")
}
