//! Where a design's migrations live in the project: one SQL file per migration of the schema
//! plan, named from the design alone, so that the machine (which does no I/O) and the conductor
//! (which writes and reads them) agree on every path.
//!
//! **Invariant:** a file name is a pure function of the migrations directory, the migration's
//! position in the plan and the migration itself. The files are written when the design is
//! frozen, never over a file that holds something else, and every run and the promotion read
//! their SQL from them (checked against the frozen design first).

use serde::{Deserialize, Serialize};

use crate::core::artifact::{Migration, SchemaPlan};

/// The longest name part of a file name, in bytes (the rest is cut).
const MAX_NAME_PART: usize = 60;

/// Where the design's migrations are written, and whether the other migrations already in that
/// directory are applied first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigrationFiles {
    /// The directory, relative to the work tree, such as `migrations`.
    pub dir: String,
    /// Whether the `.sql` files already in `dir` that are not the design's (a project's
    /// existing migrations) are applied before the design's, in version order.
    pub apply_existing: bool,
    /// Whether the promotion applies those existing migrations to the parent too (before the
    /// design's; a version the parent's record already holds is skipped). Off for a parent
    /// that got them from the project's own migration tool.
    pub promote_existing: bool,
    /// The feature whose design it is, when that feature runs in a lane: its id goes into
    /// every file name after the number (`0001_<feature>_S1_items.sql`), so that lanes that
    /// run at once never write the same file, and their files still sort by number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lane: Option<String>,
    /// The project's own migration tool, when it (not Consort) applies the migrations: the
    /// design's migrations are then files in the tool's format, and no existing file is
    /// applied by Consort. None: plain SQL files Consort applies itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolFormat>,
}

/// How a project's migration tool keeps a migration: what the design's migration files are
/// written as, beside the project's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ToolFormat {
    /// The tool, as `[migrations] tool` names it (`knex`, `alembic`, `django`, `dbmate`,
    /// `command`).
    pub name: String,
    /// The extension of a migration file, without the dot (`js`, `py`, `sql`).
    pub extension: String,
    /// How the tool's own bookkeeping names a migration it applied.
    #[serde(default)]
    pub recorded: Recorded,
}

/// How a migration tool's bookkeeping table names an applied migration file.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Recorded {
    /// The file name without its extension (Django's `0002_labels`).
    #[default]
    Stem,
    /// The whole file name (Knex's `20261207120000_labels.js`).
    FileName,
    /// The leading digits of the name (dbmate's `20261207120000`).
    Number,
    /// The `revision` the file declares, and only the newest one (Alembic keeps its head).
    Revision,
}

impl ToolFormat {
    /// Whether the tool applies the migrations as files of SQL (dbmate, a generic command over
    /// `.sql` files), so the plan's content is SQL.
    pub fn is_sql(&self) -> bool {
        self.extension == "sql"
    }

    /// What the tool's bookkeeping holds once it applied `files` (tree-relative path and
    /// content, in order): the records that show each of them applied.
    pub fn expected_records(&self, files: &[(String, &str)]) -> Vec<String> {
        let name = |path: &str| path.rsplit('/').next().unwrap_or(path).to_string();
        match self.recorded {
            Recorded::FileName => files.iter().map(|(p, _)| name(p)).collect(),
            Recorded::Stem => files
                .iter()
                .map(|(p, _)| {
                    let n = name(p);
                    match n.rsplit_once('.') {
                        Some((stem, _)) => stem.to_string(),
                        None => n,
                    }
                })
                .collect(),
            Recorded::Number => files
                .iter()
                .map(|(p, _)| name(p).chars().take_while(char::is_ascii_digit).collect())
                .collect(),
            Recorded::Revision => files
                .last()
                .and_then(|(_, content)| declared_revision(content))
                .into_iter()
                .collect(),
        }
    }

    /// Whether `content` is a migration in the tool's format, as far as its text tells: what
    /// the tool would refuse or silently skip is refused at the design, with the form it
    /// takes. A generic command's files are not read.
    pub fn check_content(&self, content: &str) -> Result<(), String> {
        let (needs, form): (&[&[&str]], &str) = match self.name.as_str() {
            "knex" => (
                &[&["exports.up", "function up", "up:", "up ="]],
                "a Knex migration module: `exports.up = function (knex) { … }` and `exports.down`",
            ),
            "alembic" => (
                &[&["def upgrade"], &["down_revision"], &["revision"]],
                "an Alembic revision: `revision`, `down_revision` (the current head) and `def upgrade()`",
            ),
            "django" => (
                &[&["class Migration"], &["dependencies"]],
                "a Django migration: `class Migration(migrations.Migration)` with its `dependencies` and `operations`",
            ),
            "dbmate" => (
                &[&["-- migrate:up"]],
                "a dbmate migration: a `-- migrate:up` section (and `-- migrate:down`)",
            ),
            _ => (&[], ""),
        };
        match needs
            .iter()
            .find(|any| !any.iter().any(|n| content.contains(n)))
        {
            Some(missing) => Err(format!(
                "is not {form} (it lacks `{}`)",
                missing.join("` or `")
            )),
            None => Ok(()),
        }
    }
}

impl MigrationFiles {
    /// The design's migration files in plan order: the tree-relative path of each, with the
    /// migration it holds.
    pub fn planned<'a>(&self, plan: &'a SchemaPlan) -> Vec<(String, &'a Migration)> {
        plan.migrations
            .iter()
            .enumerate()
            .map(|(i, m)| (format!("{}/{}", self.dir, self.file_name(i, m)), m))
            .collect()
    }

    /// Whether the project's migration tool applies the migrations (see [`ToolFormat`]).
    pub fn by_tool(&self) -> bool {
        self.tool.is_some()
    }

    /// [`file_name`], in the tool's extension, with the lane's feature after the number when
    /// there is one.
    fn file_name(&self, index: usize, m: &Migration) -> String {
        let name = file_name(index, m);
        let name = match &self.tool {
            Some(t) if !t.is_sql() => {
                format!("{}.{}", name.trim_end_matches(".sql"), t.extension)
            }
            _ => name,
        };
        let Some(lane) = self.lane.as_deref().map(slug).filter(|l| !l.is_empty()) else {
            return name;
        };
        match name.split_once('_') {
            Some((number, rest)) => format!("{number}_{lane}_{rest}"),
            None => match name.rsplit_once('.') {
                Some((stem, ext)) => format!("{stem}_{lane}.{ext}"),
                None => format!("{name}_{lane}"),
            },
        }
    }
}

/// The file name of the `index`-th migration (0-based) of a plan:
/// `NNNN_<story>_<name>.sql`. `NNNN` is the version's leading digits when it has them
/// (`0003_reservations` → `0003`), else the 1-based position, four digits wide; `<name>` is
/// the rest of the version. Both parts keep only ASCII letters, digits, `-` and `_`.
pub fn file_name(index: usize, m: &Migration) -> String {
    let digits: String = m.version.chars().take_while(char::is_ascii_digit).collect();
    let number = if digits.is_empty() {
        format!("{:04}", index + 1)
    } else {
        digits.clone()
    };
    let rest = m.version[digits.len()..].trim_start_matches(['_', '-', '.', ' ']);
    let name = match slug(rest) {
        s if s.is_empty() => slug(&m.description),
        s => s,
    };
    let story = slug(&m.story_id);
    match (story.is_empty(), name.is_empty()) {
        (false, false) => format!("{number}_{story}_{name}.sql"),
        (false, true) => format!("{number}_{story}.sql"),
        (true, false) => format!("{number}_{name}.sql"),
        (true, true) => format!("{number}.sql"),
    }
}

/// The `revision = "…"` an Alembic file declares (`revision: str = '…'` too).
fn declared_revision(content: &str) -> Option<String> {
    content.lines().find_map(|line| {
        let rest = line.trim_start().strip_prefix("revision")?;
        let rest = rest.trim_start();
        let rest = match rest.strip_prefix(':') {
            Some(typed) => typed.split_once('=')?.1,
            None => rest.strip_prefix('=')?,
        };
        let value = rest.trim().trim_matches(|c| c == '"' || c == '\'');
        (!value.is_empty() && value.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .then(|| value.to_string())
    })
}

/// Keeps ASCII letters, digits, `-` and `_`; every other run of characters becomes one `_`.
fn slug(s: &str) -> String {
    let mut out = String::new();
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            out.push(c);
        } else if !out.ends_with('_') {
            out.push('_');
        }
    }
    let mut out = out.trim_matches('_').to_string();
    if out.len() > MAX_NAME_PART {
        out.truncate(MAX_NAME_PART);
        out = out.trim_end_matches('_').to_string();
    }
    out
}

/// How a project numbers the migration files in its migrations directory (`001_products.sql`:
/// three digits), read when a feature starts and recorded in its start: the design's versions
/// take that form, after the last number, so that the project's own migration tool, which
/// orders the files by name, applies them in order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct MigrationNumbering {
    /// The digits of every number.
    pub width: usize,
    /// The highest number there.
    pub last: u64,
    /// A file that shows the form.
    pub example: String,
}

impl MigrationNumbering {
    /// The numbering of a migrations directory's file names: None when no name starts with
    /// a number; an error, saying why, when the numbers have different widths (a text sort
    /// puts `10_b.sql` before `9_a.sql`).
    pub fn of(names: &[String]) -> Result<Option<MigrationNumbering>, String> {
        let mut found: Option<MigrationNumbering> = None;
        for name in names {
            let Some((digits, number)) = leading_number(name) else {
                continue;
            };
            match &mut found {
                None => {
                    found = Some(MigrationNumbering {
                        width: digits,
                        last: number,
                        example: name.clone(),
                    });
                }
                Some(n) if n.width != digits => {
                    return Err(format!(
                        "the migration files are numbered with different widths ({} and {}): a text sort, as most migration scripts make, puts them out of order",
                        n.example, name
                    ));
                }
                Some(n) if number > n.last => {
                    n.last = number;
                    n.example = name.clone();
                }
                Some(_) => {}
            }
        }
        Ok(found)
    }

    /// Checks that `version` takes this form and comes after the last number.
    pub fn check(&self, version: &str) -> Result<(), String> {
        let fits = leading_number(version)
            .is_some_and(|(digits, number)| digits == self.width && number > self.last);
        if fits {
            return Ok(());
        }
        let next = self.last.saturating_add(1);
        Err(format!(
            "migration {version} does not follow the project's numbering: its migration files take {} digits (like {}), so the version must start with a {}-digit number after {:0w$}, such as {:0w$}_{}",
            self.width,
            self.example,
            self.width,
            self.last,
            next,
            version.trim_start_matches(|c: char| c.is_ascii_digit() || c == '_'),
            w = self.width
        ))
    }
}

/// The leading digits of `name`: how many, and their number (None: no leading digit, or more
/// than a `u64` holds).
fn leading_number(name: &str) -> Option<(usize, u64)> {
    let digits: String = name.chars().take_while(char::is_ascii_digit).collect();
    Some((digits.len(), digits.parse().ok()?))
}

/// Orders existing migration file names by version, as migration tools do: the leading
/// number of the name (after a Flyway-style `V`) numerically, then the name.
pub(crate) fn version_order(a: &str, b: &str) -> std::cmp::Ordering {
    fn key(name: &str) -> (Option<u128>, &str) {
        let body = name
            .strip_prefix(['V', 'v'])
            .filter(|r| r.starts_with(|c: char| c.is_ascii_digit()))
            .unwrap_or(name);
        let digits: String = body.chars().take_while(char::is_ascii_digit).collect();
        (digits.parse().ok(), name)
    }
    let (ka, kb) = (key(a), key(b));
    match (ka.0, kb.0) {
        (Some(x), Some(y)) => x.cmp(&y).then(ka.1.cmp(kb.1)),
        (Some(_), None) => std::cmp::Ordering::Less,
        (None, Some(_)) => std::cmp::Ordering::Greater,
        (None, None) => ka.1.cmp(kb.1),
    }
}

/// What applying an existing migration file runs: the whole file, or for a dbmate file (a
/// `-- migrate:up` line, then optionally `-- migrate:down`) only its up section — the down
/// section undoes it, and run after it would leave the database as if it never ran.
pub(crate) fn up_section(sql: &str) -> &str {
    let marker = |line: &str, what: &str| {
        line.trim_start()
            .strip_prefix("-- migrate:")
            .is_some_and(|rest| rest.split_whitespace().next() == Some(what))
    };
    let mut at = 0;
    let mut up = None;
    for line in sql.split_inclusive('\n') {
        if up.is_none() && marker(line, "up") {
            up = Some(at + line.len());
        } else if let Some(start) = up
            && marker(line, "down")
        {
            return &sql[start..at];
        }
        at += line.len();
    }
    up.map_or(sql, |start| &sql[start..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dbmate_file_is_applied_up_section_only_and_any_other_file_whole() {
        let dbmate = "-- migrate:up\nCREATE TABLE a (id int);\n\n-- migrate:down\nDROP TABLE a;\n";
        assert_eq!(up_section(dbmate), "CREATE TABLE a (id int);\n\n");
        let options = "-- migrate:up transaction:false\nCREATE INDEX CONCURRENTLY i ON a (id);\n";
        assert_eq!(
            up_section(options),
            "CREATE INDEX CONCURRENTLY i ON a (id);\n"
        );
        let plain = "CREATE TABLE b (id int); -- migrate:down is only a comment here\n";
        assert_eq!(up_section(plain), plain);
        let down_first = "-- migrate:down\nDROP TABLE a;\n";
        assert_eq!(up_section(down_first), down_first);
    }

    #[test]
    fn a_projects_numbering_is_read_and_held_to() {
        let names = |n: &[&str]| n.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let three =
            MigrationNumbering::of(&names(&["001_products.sql", "002_orders.sql", "README"]))
                .expect("one width")
                .expect("numbered");
        assert_eq!((three.width, three.last), (3, 2));
        assert!(three.check("003_order_lines").is_ok());
        let told = three.check("0003_order_lines").expect_err("four digits");
        assert!(told.contains("3 digits (like 002_orders.sql)"), "{told}");
        assert!(told.contains("such as 003_order_lines"), "{told}");
        assert!(three.check("002_again").is_err(), "not after the last");
        assert!(three.check("orders").is_err(), "no number");
        assert_eq!(
            MigrationNumbering::of(&names(&["V1__counts.sql"])),
            Ok(None)
        );
        let mixed = MigrationNumbering::of(&names(&["9_a.sql", "10_b.sql"])).expect_err("mixed");
        assert!(mixed.contains("different widths"), "{mixed}");
        let stamps = MigrationNumbering::of(&names(&["20240101120000_init.sql"]))
            .expect("one width")
            .expect("numbered");
        assert!(stamps.check("20240101120001_orders").is_ok());
    }

    fn m(version: &str, story: &str, description: &str) -> Migration {
        Migration {
            version: version.into(),
            story_id: story.into(),
            description: description.into(),
            sql: "select 1;".into(),
        }
    }

    #[test]
    fn a_lanes_files_carry_its_feature_after_the_number() {
        let mut files = MigrationFiles {
            dir: "migrations".into(),
            apply_existing: false,
            promote_existing: false,
            lane: Some("f2 orders".into()),
            tool: None,
        };
        let plan = SchemaPlan {
            migrations: vec![m("0001_items", "S1", ""), m("0002", "", "")],
        };
        let names: Vec<String> = files.planned(&plan).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            names,
            [
                "migrations/0001_f2_orders_S1_items.sql",
                "migrations/0002_f2_orders.sql"
            ]
        );
        files.lane = None;
        assert_eq!(files.planned(&plan)[0].0, "migrations/0001_S1_items.sql");
    }

    #[test]
    fn a_tools_files_take_its_extension() {
        let plan = SchemaPlan {
            migrations: vec![m("20261207120000_labels", "S1", ""), m("0002", "", "")],
        };
        let tool = |ext: &str| MigrationFiles {
            dir: "db/migrations".into(),
            apply_existing: false,
            promote_existing: false,
            lane: Some("F2".into()),
            tool: Some(ToolFormat {
                name: "knex".into(),
                extension: ext.into(),
                recorded: Recorded::FileName,
            }),
        };
        let names: Vec<String> = tool("js")
            .planned(&plan)
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(
            names,
            [
                "db/migrations/20261207120000_F2_S1_labels.js",
                "db/migrations/0002_F2.js"
            ]
        );
        assert_eq!(tool("sql").planned(&plan)[1].0, "db/migrations/0002_F2.sql");
    }

    #[test]
    fn each_tool_records_a_migration_under_its_own_name() {
        let files = vec![
            ("db/0003_S1_a.py".to_string(), "revision = 'aa11'\n"),
            (
                "db/20261207120000_S2_b.js".to_string(),
                "revision: str = \"bb22\"\ndown_revision = 'aa11'\n",
            ),
        ];
        let records = |recorded| {
            ToolFormat {
                name: "x".into(),
                extension: "py".into(),
                recorded,
            }
            .expected_records(&files)
        };
        assert_eq!(
            records(Recorded::Stem),
            ["0003_S1_a", "20261207120000_S2_b"]
        );
        assert_eq!(
            records(Recorded::FileName),
            ["0003_S1_a.py", "20261207120000_S2_b.js"]
        );
        assert_eq!(records(Recorded::Number), ["0003", "20261207120000"]);
        assert_eq!(records(Recorded::Revision), ["bb22"]);
    }

    #[test]
    fn a_migration_not_in_the_tools_format_is_refused_with_the_form() {
        let tool = |name: &str| ToolFormat {
            name: name.into(),
            extension: "py".into(),
            recorded: Recorded::Stem,
        };
        let told = tool("alembic")
            .check_content("def upgrade():\n    pass\n")
            .expect_err("no revision");
        assert!(told.contains("down_revision"), "{told}");
        assert!(tool("knex").check_content("CREATE TABLE x ();").is_err());
        assert!(
            tool("knex")
                .check_content("exports.up = (knex) => knex.schema.createTable('x', () => {});")
                .is_ok()
        );
        assert!(tool("command").check_content("anything").is_ok());
    }

    #[test]
    fn names_come_from_the_version_and_the_story() {
        assert_eq!(
            [
                file_name(0, &m("0001_stock_records", "S1", "")),
                file_name(4, &m("20240101120000-add index", "S2", "")),
                file_name(2, &m("add_reservations", "S3", "")),
                file_name(0, &m("0007", "S1", "Stock by location!")),
            ],
            [
                "0001_S1_stock_records.sql",
                "20240101120000_S2_add_index.sql",
                "0003_S3_add_reservations.sql",
                "0007_S1_Stock_by_location.sql",
            ]
        );
    }

    #[test]
    fn no_name_can_leave_the_directory_or_hide_in_a_subdirectory() {
        for version in [
            "../../etc/passwd",
            "0001/../../x",
            "/abs",
            "0001_\u{0}\n",
            "..",
            ".",
        ] {
            let name = file_name(0, &m(version, "../S1", "a/b"));
            assert!(!name.contains('/'), "{name}");
            assert!(!name.contains(".."), "{name}");
            assert!(name.ends_with(".sql") && !name.starts_with('.'), "{name}");
        }
        let long = file_name(0, &m(&format!("0001_{}", "x".repeat(500)), "S1", ""));
        assert!(long.len() < 100, "{long}");
    }

    #[test]
    fn planned_files_are_in_plan_order_under_the_directory() {
        let plan = SchemaPlan {
            migrations: vec![m("0001_a", "S1", ""), m("0002_b", "S2", "")],
        };
        let files = MigrationFiles {
            dir: "db/migrations".into(),
            apply_existing: true,
            promote_existing: true,
            lane: None,
            tool: None,
        };
        let got: Vec<String> = files.planned(&plan).into_iter().map(|(p, _)| p).collect();
        assert_eq!(
            got,
            ["db/migrations/0001_S1_a.sql", "db/migrations/0002_S2_b.sql"]
        );
    }

    #[test]
    fn existing_files_sort_by_their_version_number() {
        let mut names = vec![
            "V10__later.sql",
            "V2__second.sql",
            "V1__first.sql",
            "notes.sql",
            "0003_x.sql",
        ];
        names.sort_by(|a, b| version_order(a, b));
        assert_eq!(
            names,
            [
                "V1__first.sql",
                "V2__second.sql",
                "0003_x.sql",
                "V10__later.sql",
                "notes.sql"
            ]
        );
    }
}
