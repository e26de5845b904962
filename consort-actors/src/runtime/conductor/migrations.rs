//! The design's migrations as files in the project: written when the design is frozen, observed
//! before every build step, and read back for every run and for the promotion.
//!
//! **Invariant:** what a branch or the parent database gets is read from the files, and only
//! after each file was found to hold exactly the frozen design's SQL; a file that holds
//! anything else is never overwritten.

use std::collections::BTreeMap;

use crate::core::artifact::{Migration, SchemaPlan};
use crate::core::hash::ContentHash;
use crate::core::migration_files::{MigrationFiles, up_section, version_order};
use crate::core::regression::EarlierMigration;
use crate::worktree::WorkTree;

use super::{ConductorError, write_file_via};

/// The story id given to a project's existing migrations.
pub(super) const EXISTING_STORY: &str = "existing";

/// Writes each of the design's migration files that is not there yet. A file already holding
/// the migration's SQL is left alone (a resumed run); one holding anything else is an error,
/// and nothing of it is overwritten.
pub(super) fn write_frozen(
    work: &WorkTree,
    files: &MigrationFiles,
    plan: &SchemaPlan,
) -> Result<(), ConductorError> {
    for (path, m) in files.planned(plan) {
        match checksum_on_disk(work, &path) {
            Ok(Some(found)) if found == m.checksum() => continue,
            Ok(Some(_)) => {
                return Err(problem(
                    &path,
                    "already exists and holds other SQL; Consort never overwrites a file (move it, or give the migration another version)",
                ));
            }
            // Through Consort's state directory, which no hash reads: a run killed mid-write
            // leaves no half-written migration behind.
            Ok(None) => write_file_via(
                &work.root().join(&path),
                &m.sql,
                &work.root().join(crate::core::paths::STATE_DIR),
            )?,
            Err(e) => return Err(problem(&path, &e)),
        }
    }
    Ok(())
}

/// The checksum of each of the design's migration files as found on disk (None: missing or
/// unreadable), for [`crate::core::machine::Event::Observed`].
pub(super) fn observe(
    work: &WorkTree,
    files: &MigrationFiles,
    plan: &SchemaPlan,
) -> BTreeMap<String, Option<ContentHash>> {
    files
        .planned(plan)
        .into_iter()
        .map(|(path, _)| {
            let found = checksum_on_disk(work, &path).ok().flatten();
            (path, found)
        })
        .collect()
}

/// The migrations a run (or, with `promote`, the promotion) applies, read from the files: the
/// project's existing migrations first (when [`MigrationFiles::apply_existing`], and for the
/// promotion [`MigrationFiles::promote_existing`]), then each of `requested` (the design's, as
/// the machine asked for them) from its file, which must hold exactly the design's SQL.
///
/// A file an earlier feature of the project wrote is its migration, under the version that
/// feature's design gave it (so a database that has it records it as applied already); it
/// must still hold that migration's SQL.
pub(super) fn from_disk(
    work: &WorkTree,
    (files, earlier): (&MigrationFiles, &[EarlierMigration]),
    plan: &SchemaPlan,
    (requested, promote): (&[Migration], bool),
) -> Result<Vec<Migration>, ConductorError> {
    let planned = files.planned(plan);
    let with_existing =
        files.apply_existing && !files.by_tool() && (!promote || files.promote_existing);
    let mut out = if with_existing {
        existing(work, files, &planned, earlier)?
    } else {
        Vec::new()
    };
    for want in requested {
        let Some((path, _)) = planned.iter().find(|(_, m)| m.version == want.version) else {
            return Err(problem(
                &want.version,
                "is not a migration of the frozen design",
            ));
        };
        let sql = match work.read(path) {
            Ok(Some(sql)) => sql,
            Ok(None) => return Err(problem(path, "is missing")),
            Err(e) => return Err(problem(path, &e)),
        };
        if Migration::checksum_of(&sql) != want.checksum() {
            return Err(problem(
                path,
                "no longer holds the approved migration; put it back (its SQL is in the frozen design, design.json in the feature's record under .consort/)",
            ));
        }
        out.push(Migration {
            sql,
            ..want.clone()
        });
    }
    Ok(out)
}

/// The project's existing migrations, as every run of a feature starts from them before its
/// design's: the migrations directory's files in version order, an earlier
/// feature's under its version; none unless [`MigrationFiles::apply_existing`]. What
/// `consort doctor --baseline` builds its branch's base from.
pub fn existing_migrations(
    work: &WorkTree,
    files: &MigrationFiles,
    earlier: &[EarlierMigration],
) -> Result<Vec<Migration>, ConductorError> {
    if !files.apply_existing || files.by_tool() {
        return Ok(Vec::new());
    }
    existing(work, files, &[], earlier)
}

/// The `.sql` files of the migrations directory that are not the design's, in version order
/// (a tool's `.down.sql` undo files left out; `.up.sql` counts as the migration).
fn existing(
    work: &WorkTree,
    files: &MigrationFiles,
    planned: &[(String, &Migration)],
    earlier: &[EarlierMigration],
) -> Result<Vec<Migration>, ConductorError> {
    let dir = work.root().join(&files.dir);
    let entries = match std::fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(problem(&files.dir, &e)),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| problem(&files.dir, &e))?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        let path = format!("{}/{name}", files.dir);
        let is_file = entry.file_type().is_ok_and(|t| t.is_file());
        if is_file
            && name.ends_with(".sql")
            && !name.ends_with(".down.sql")
            && !planned.iter().any(|(p, _)| *p == path)
        {
            names.push(name);
        }
    }
    names.sort_by(|a, b| version_order(a, b));
    names
        .into_iter()
        .map(|name| {
            let path = format!("{}/{name}", files.dir);
            let sql = work
                .read(&path)
                .map_err(|e| problem(&path, &e))?
                .ok_or_else(|| problem(&path, "disappeared while it was read"))?;
            if let Some(e) = earlier.iter().find(|e| e.path.as_deref() == Some(&path)) {
                if Migration::checksum_of(&sql) != e.migration.checksum() {
                    return Err(problem(
                        &path,
                        &format!(
                            "no longer holds feature {}'s migration {}; put it back",
                            e.feature, e.migration.version
                        ),
                    ));
                }
                return Ok(Migration {
                    sql,
                    ..e.migration.clone()
                });
            }
            let version = name.trim_end_matches(".sql").trim_end_matches(".up");
            Ok(Migration {
                version: version.to_string(),
                story_id: EXISTING_STORY.into(),
                description: format!("existing migration {name}"),
                sql: up_section(&sql).to_string(),
            })
        })
        .collect()
}

/// With the project's migration tool, which applies every migration in its folder, the
/// design's files a run must not see: those of the migrations it does not apply (a later
/// story's; all of them for the baseline), as paths in the work tree. None without a tool.
pub(super) fn unseen_by_tool(
    work: &WorkTree,
    files: &MigrationFiles,
    plan: &SchemaPlan,
    applied: &[Migration],
) -> Vec<std::path::PathBuf> {
    if !files.by_tool() {
        return Vec::new();
    }
    files
        .planned(plan)
        .into_iter()
        .filter(|(_, m)| !applied.iter().any(|a| a.version == m.version))
        .map(|(path, _)| work.root().join(path))
        .collect()
}

/// With the project's migration tool, the records its bookkeeping holds once it applied
/// `applied` (the design's migrations of a run, read from their files). None without a tool.
pub(super) fn tool_records(
    files: &MigrationFiles,
    plan: &SchemaPlan,
    applied: &[Migration],
) -> Vec<String> {
    let Some(tool) = &files.tool else {
        return Vec::new();
    };
    let listed: Vec<(String, &str)> = files
        .planned(plan)
        .into_iter()
        .filter_map(|(path, m)| {
            let a = applied.iter().find(|a| a.version == m.version)?;
            Some((path, a.sql.as_str()))
        })
        .collect();
    tool.expected_records(&listed)
}

fn checksum_on_disk(work: &WorkTree, path: &str) -> Result<Option<ContentHash>, String> {
    match work.read(path) {
        Ok(Some(sql)) => Ok(Some(Migration::checksum_of(&sql))),
        Ok(None) => Ok(None),
        Err(e) => Err(crate::core::text::error_chain(&e)),
    }
}

fn problem(path: &str, what: &(impl std::fmt::Display + ?Sized)) -> ConductorError {
    ConductorError::MigrationFile {
        path: path.to_string(),
        problem: what.to_string(),
    }
}
