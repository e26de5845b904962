//! The project's own migration tool, per tool: Knex (npm), dbmate (npm), Alembic with
//! SQLAlchemy and Django (pip), and Consort's own for plain SQL files and psql scripts. Each project keeps its schema in its tool (one migration that
//! makes `shelves`) and tests with psql; its feature's design adds `labels`, with a foreign
//! key to `shelves`, as a migration in the tool's own format and naming. From `consort init`
//! to done with no hand step: init finds the tool and writes `[migrations] tool`, doctor runs
//! it on a fresh branch, every run gets its tables from the tool, the promotion runs it on the
//! parent, and `consort exec` then sees `labels` and the tool's own record of it.
//!
//! Plain SQL files and a psql script, which Consort applies itself, run the same feature.

use std::path::Path;

use crate::adopt::{adopt_and_run_with, repo_of, script_of};
use crate::common::script::Design;
use crate::common::{assert_exit, consort, dir_arg, run, toolchain};
use consort_testkit::process::text;

/// The table the design adds, with its foreign key to the project's own table.
const LABELS: &str = "CREATE TABLE labels (id serial PRIMARY KEY, shelf_id int NOT NULL REFERENCES shelves(id), text text NOT NULL)";

/// The project's test files and code, the same for every tool: its existing test needs the
/// tool's `shelves`; the feature's test needs the design's `labels` and the GREEN's function.
const SQL_PROJECT: [(&str, &str); 2] = [
    (
        "sql/version.sql",
        "CREATE FUNCTION shelf_version() RETURNS int LANGUAGE sql AS 'SELECT 1';\n",
    ),
    (
        "tests/t0_shelves.sql",
        "INSERT INTO shelves (name) VALUES ('top');\nDO $$ BEGIN IF shelf_version() <> 1 THEN RAISE EXCEPTION 'wrong version'; END IF; END $$;\n",
    ),
];

/// One tool's case: the project (its files beside [`SQL_PROJECT`]), the design's migration
/// (version, file content), what init says it found, the design's file as written, and the
/// query that lists the tool's records with the record the promotion must leave.
struct Case<'a> {
    tool: &'a str,
    /// The names init must find the project reading its database under (none: libpq's).
    names: &'a [&'a str],
    files: Vec<(&'a str, String)>,
    migration: (&'a str, String),
    found: &'a str,
    written: &'a str,
    records: (&'a str, &'a str),
}

/// Runs `case` in a fresh project with `path` first on `PATH` (a virtual environment's `bin`)
/// and `modules` as its `node_modules`.
fn run_case(case: &Case<'_>, path: Option<&Path>, modules: Option<&Path>) {
    let mut files: Vec<(&str, &str)> = SQL_PROJECT.to_vec();
    files.extend(case.files.iter().map(|(p, c)| (*p, c.as_str())));
    let tmp = repo_of(&files);
    let dir = tmp.path();
    if let Some(modules) = modules {
        toolchain::install_node_modules(modules, dir);
    }
    let escaped = case.migration.1.replace('\\', "\\\\").replace('\n', "\\n");
    let design = Design {
        feature: "F1",
        story: "Labels",
        migration: (case.migration.0, &escaped),
        test_path: "tests/t1_labels.sql",
        test_name: None,
    };
    let test = "INSERT INTO shelves (id, name) VALUES (7, 'low');\nINSERT INTO labels (shelf_id, text) VALUES (7, 'jam'), (7, 'tea');\nDO $$ BEGIN IF label_count(7) <> 2 THEN RAISE EXCEPTION 'count is %', label_count(7); END IF; END $$;\n";
    let code = "CREATE FUNCTION label_count(shelf int) RETURNS bigint LANGUAGE sql AS $$ SELECT count(*) FROM labels WHERE shelf_id = shelf $$;\n";
    let script = script_of(&design, test, ("sql/labels.sql", code));
    let search = path.map(toolchain::path_with);
    let (init, doctor, ran) = adopt_and_run_with(dir, &script, search.as_deref());
    assert!(init.contains(case.found), "{init}");
    if !case.names.is_empty() {
        let found = format!(
            "found the database under the project's own names in {}: {}",
            case.names[0],
            case.names[1..].join(", ")
        );
        assert!(init.contains(&found), "{init}");
    }
    // The gates name the design's migration by its file, and the tool that applies it.
    let by = if case.tool == "sql" {
        String::new()
    } else {
        format!(", applied by {}", case.tool)
    };
    for gate in ["1 migration", "promote 1 migration"] {
        assert!(
            ran.contains(&format!("{gate} ({}{by})", case.written)),
            "{gate}: {ran}"
        );
    }
    let config = std::fs::read_to_string(dir.join("consort.toml")).expect("consort.toml");
    // Plain SQL and psql scripts are Consort's own to apply: no tool is configured or run.
    let by_consort = case.tool == "sql";
    assert_eq!(config.contains("tool = \""), !by_consort, "{config}");
    assert_eq!(
        doctor.contains(&format!(
            "the project's migration tool, {}, applied the migrations in {}/ on a fresh branch, confined",
            case.tool,
            case.written.rsplit_once('/').map_or("", |(d, _)| d)
        )) && doctor.contains("its bookkeeping records 1 migration"),
        !by_consort,
        "{doctor}"
    );
    // Doctor checked that the tool's command can start before it ran it.
    assert_eq!(
        doctor.contains("ok    the migration tool's program "),
        !by_consort,
        "{doctor}"
    );
    // What doctor says the tool took, for BENCHMARKS.md (shown with --nocapture).
    for line in doctor.lines().filter(|l| l.contains("migration tool, ")) {
        println!("{line}");
    }
    shown_to_the_dba(dir);
    let written = std::fs::read_to_string(dir.join(case.written)).expect("the design's file");
    assert_eq!(
        written, case.migration.1,
        "the design's migration, as frozen"
    );
    let mut exec = consort();
    if let Some(search) = &search {
        exec.env("PATH", search);
    }
    let query = format!(
        "psql -XAtc \"SELECT count(*) FROM information_schema.table_constraints WHERE table_name = 'labels' AND constraint_type = 'FOREIGN KEY'\" && psql -XAtc \"{}\"",
        case.records.0
    );
    let o = run(exec
        .arg("exec")
        .args(dir_arg(dir))
        .args(["--", "sh", "-c", &query]));
    assert_exit(
        &o,
        0,
        "exec reads the parent's labels and the tool's records",
    );
    let out = String::from_utf8_lossy(&o.stdout);
    let mut lines = out.lines();
    assert_eq!(
        lines.next(),
        Some("1"),
        "labels, with its foreign key: {}",
        text(&o)
    );
    let records: Vec<&str> = lines.collect();
    assert!(
        records.contains(&case.records.1),
        "the tool's bookkeeping records the design's migration: {}",
        text(&o)
    );
}

/// The DBA was shown the project's `shelves` as the tool made it: the feature's start records
/// the database's tables, which the schema step's assignment carries.
fn shown_to_the_dba(dir: &Path) {
    let project = consort::project::Project::open(dir).expect("project");
    let events = consort_testkit::ledger::events(&project.ledger_path());
    let catalog = events
        .iter()
        .find_map(|e| match e {
            consort::actors::Event::Start { inherited, .. } => inherited.catalog.clone(),
            _ => None,
        })
        .expect("the start records the database's tables");
    let shelves = catalog
        .table("public.shelves")
        .unwrap_or_else(|| panic!("shelves among the tables: {catalog:?}"));
    assert!(
        shelves.columns.contains(&"name text NOT NULL".to_string())
            && shelves
                .constraints
                .iter()
                .any(|c| c.contains("PRIMARY KEY (id)")),
        "{shelves:?}"
    );
}

/// Plain SQL, the `shelves` migration as Consort applies it itself.
#[test]
fn a_plain_sql_project_runs_to_done_with_its_migrations_applied_by_consort() {
    sql_case(
        "CREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL);\n",
        "found 1 migration file(s) in db/migrations/",
    );
}

/// A psql script (a meta-command and a variable), applied by psql as the project's own file.
#[test]
fn a_psql_script_project_runs_to_done_with_its_migrations_applied_by_psql() {
    sql_case(
        "\\set table shelves\nCREATE TABLE :\"table\" (id serial PRIMARY KEY, name text NOT NULL);\n",
        "found 1 migration file(s) in db/migrations/",
    );
}

/// The SQL cases: `shelves` made by `existing`, the design's `labels` as plain SQL.
fn sql_case(existing: &str, found: &str) {
    run_case(
        &Case {
            tool: "sql",
            names: &[],
            files: vec![("db/migrations/0001_shelves.sql", existing.into())],
            migration: ("0002_labels", format!("{LABELS};")),
            found,
            written: "db/migrations/0002_S1_labels.sql",
            records: (
                "SELECT version FROM consort_migrations ORDER BY version",
                "0002_labels",
            ),
        },
        None,
        None,
    );
}

#[test]
fn a_knex_project_runs_to_done_with_its_migrations_applied_by_knex() {
    let modules = toolchain::npm("knex3", &["knex@3", "pg@8"], "knex");
    // The connection under the project's own names, which init maps the branch onto.
    let knexfile = "const fail = (name) => {\n  throw new Error(name + ' is not set');\n};\nmodule.exports = {\n  client: 'pg',\n  connection: {\n    host: process.env.DB_HOST || fail('DB_HOST'),\n    port: Number(process.env.DB_PORT || fail('DB_PORT')),\n    database: process.env.DB_NAME || fail('DB_NAME'),\n    user: process.env.DB_USER || fail('DB_USER'),\n    password: process.env.DB_PASSWORD,\n  },\n  migrations: { directory: './db/migrations' },\n};\n";
    let shelves = "exports.up = (knex) => knex.raw('CREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL)');\nexports.down = (knex) => knex.raw('DROP TABLE shelves');\n";
    let labels = format!(
        "exports.up = (knex) => knex.raw('{LABELS}');\nexports.down = (knex) => knex.raw('DROP TABLE labels');\n"
    );
    run_case(
        &Case {
            tool: "knex",
            names: &["knexfile.js", "DB_HOST", "DB_NAME", "DB_PASSWORD", "DB_PORT", "DB_USER"],
            files: vec![
                (
                    "package.json",
                    r#"{"name":"shelf","version":"1.0.0","private":true,"dependencies":{"knex":"^3","pg":"^8"}}"#.into(),
                ),
                ("knexfile.js", knexfile.into()),
                ("db/migrations/20261206120000_shelves.js", shelves.into()),
            ],
            migration: ("20261207120000_labels", labels),
            found: "found Knex migrations (knexfile.js, 1 in db/migrations/)",
            written: "db/migrations/20261207120000_S1_labels.js",
            records: (
                "SELECT name FROM knex_migrations ORDER BY id",
                "20261207120000_S1_labels.js",
            ),
        },
        None,
        Some(&modules),
    );
}

#[test]
fn a_dbmate_project_runs_to_done_with_its_migrations_applied_by_dbmate() {
    let modules = toolchain::npm("dbmate2", &["dbmate@2"], "dbmate");
    let shelves = "-- migrate:up\nCREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL);\n\n-- migrate:down\nDROP TABLE shelves;\n";
    run_case(
        &Case {
            tool: "dbmate",
            names: &[],
            files: vec![("db/migrations/20261206120000_shelves.sql", shelves.into())],
            migration: (
                "20261207120000_labels",
                format!("-- migrate:up\n{LABELS};\n\n-- migrate:down\nDROP TABLE labels;\n"),
            ),
            found: "found dbmate migrations (-- migrate:up sections, 1 in db/migrations/)",
            written: "db/migrations/20261207120000_S1_labels.sql",
            records: (
                "SELECT version FROM schema_migrations ORDER BY version",
                "20261207120000",
            ),
        },
        None,
        Some(&modules),
    );
}

/// An Alembic revision `revision` after `down` (None: the first), running `sql`.
fn alembic_revision(revision: &str, down: Option<&str>, sql: &str) -> String {
    let down = down.map_or("None".to_string(), |d| format!("'{d}'"));
    format!(
        "from alembic import op\n\nrevision = '{revision}'\ndown_revision = {down}\nbranch_labels = None\ndepends_on = None\n\n\ndef upgrade():\n    op.execute('{sql}')\n\n\ndef downgrade():\n    pass\n"
    )
}

#[test]
fn an_alembic_project_runs_to_done_with_its_migrations_applied_by_alembic() {
    let bin = toolchain::venv(
        "alembic1",
        &["alembic==1.*", "sqlalchemy==2.*", "psycopg[binary]"],
        "alembic, sqlalchemy, psycopg",
    );
    let ini = "[alembic]\nscript_location = %(here)s/alembic\nprepend_sys_path = .\n";
    let env = "import os\nfrom alembic import context\nfrom sqlalchemy import create_engine, pool\n\nurl = 'postgresql+psycopg://' + os.environ['DATABASE_URL'].split('://', 1)[1]\nengine = create_engine(url, poolclass=pool.NullPool)\nwith engine.connect() as connection:\n    context.configure(connection=connection, target_metadata=None)\n    with context.begin_transaction():\n        context.run_migrations()\n";
    run_case(
        &Case {
            tool: "alembic",
            names: &[],
            files: vec![
                ("alembic.ini", ini.into()),
                ("alembic/env.py", env.into()),
                (
                    "alembic/versions/a1_shelves.py",
                    alembic_revision(
                        "a1",
                        None,
                        "CREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL)",
                    ),
                ),
            ],
            migration: ("b2_labels", alembic_revision("b2", Some("a1"), LABELS)),
            found: "found Alembic migrations (alembic.ini, 1 in alembic/versions/)",
            written: "alembic/versions/0001_S1_b2_labels.py",
            records: ("SELECT version_num FROM alembic_version", "b2"),
        },
        Some(&bin),
        None,
    );
}

/// A Django migration of the app `library` after `after` (None: the first), running `sql`.
fn django_migration(after: Option<&str>, sql: &str) -> String {
    let dependencies = after.map_or(String::new(), |a| format!("('library', '{a}')"));
    format!(
        "from django.db import migrations\n\n\nclass Migration(migrations.Migration):\n    dependencies = [{dependencies}]\n    operations = [migrations.RunSQL('{sql}')]\n"
    )
}

#[test]
fn a_django_project_runs_to_done_with_its_migrations_applied_by_django() {
    let bin = toolchain::venv(
        "django5",
        &["django==5.*", "psycopg[binary]"],
        "django, psycopg",
    );
    let manage = "import os\nimport sys\n\nif __name__ == '__main__':\n    os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'mysite.settings')\n    from django.core.management import execute_from_command_line\n    execute_from_command_line(sys.argv)\n";
    // The connection under the project's own names, which init maps the branch onto.
    let settings = "import os\n\nSECRET_KEY = 'test only'\nINSTALLED_APPS = ['library']\nUSE_TZ = True\nDATABASES = {'default': {\n    'ENGINE': 'django.db.backends.postgresql',\n    'NAME': os.environ['POSTGRES_DB'],\n    'USER': os.environ['POSTGRES_USER'],\n    'PASSWORD': os.environ.get('POSTGRES_PASSWORD'),\n    'HOST': os.environ['POSTGRES_SERVER'],\n    'PORT': os.environ['POSTGRES_PORT'],\n}}\n";
    run_case(
        &Case {
            tool: "django",
            names: &[
                "mysite/settings.py",
                "POSTGRES_DB",
                "POSTGRES_PASSWORD",
                "POSTGRES_PORT",
                "POSTGRES_SERVER",
                "POSTGRES_USER",
            ],
            files: vec![
                ("manage.py", manage.into()),
                ("mysite/__init__.py", String::new()),
                ("mysite/settings.py", settings.into()),
                ("library/__init__.py", String::new()),
                ("library/migrations/__init__.py", String::new()),
                (
                    "library/migrations/0001_initial.py",
                    django_migration(
                        None,
                        "CREATE TABLE shelves (id serial PRIMARY KEY, name text NOT NULL)",
                    ),
                ),
            ],
            migration: (
                "0002_labels",
                django_migration(Some("0001_initial"), LABELS),
            ),
            found: "found Django migrations (manage.py, 1 in library/migrations/)",
            written: "library/migrations/0002_S1_labels.py",
            records: (
                "SELECT name FROM django_migrations WHERE app = 'library' ORDER BY id",
                "0002_S1_labels",
            ),
        },
        Some(&bin),
        None,
    );
}
