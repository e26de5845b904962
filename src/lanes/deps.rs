//! A lane's installed dependencies: the project's own, linked.
//!
//! A lane is a git worktree, so it lacks every directory git ignores, among them what the
//! project installed (`node_modules`, a `.venv`): without them its tests cannot run, and a
//! package manager asked from inside the confinement has no network to fetch them with.
//! [`link_dependencies`] gives the lane each dependency directory the project's tree has
//! ([`consort_actors::DEPENDENCY_DIRS`], at any depth where the lane has the directory that
//! holds it) as a real directory of the lane whose entries are links to the project's:
//!
//! - what the project has installed is what the lane runs with, and a lane made (or resumed)
//!   after a person changed and installed the dependencies gets the new ones;
//! - nothing is copied and nothing is installed: one link per entry, so a lane costs its
//!   checkout, and no command runs on the way (nothing an agent wrote can run unconfined);
//! - the dependency directories are read-only to every confined run (see
//!   `WorkTree::cache_dirs`), so nothing a lane runs changes what the project's tree runs;
//!   the caches tools keep inside them (`node_modules/.vite`, …) are never linked: each lane
//!   has its own.
//!
//! An entry the lane already has (a person ran `npm ci` in it) is left as it is.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use consort_actors::TreeFilter;

/// Links the dependency directories of the tree at `project_top` into the lane at
/// `lane_top` (both the tops of their work trees); returns how many links it made. Links
/// whose target is gone (the project removed a package) are removed.
pub fn link_dependencies(project_top: &Path, lane_top: &Path) -> io::Result<usize> {
    // The links name where they lead from anywhere.
    let project_top = &std::path::absolute(project_top)?;
    let mut found = Vec::new();
    find(
        project_top,
        Path::new(""),
        &TreeFilter::default(),
        &mut found,
    )?;
    let mut linked = 0;
    for (rel, caches) in found {
        let ours = lane_top.join(&rel);
        if ours.parent().is_some_and(Path::is_dir) {
            linked += mirror(&project_top.join(&rel), &ours, caches)?;
        }
    }
    Ok(linked)
}

/// The dependency directories under `dir` (relative to the top, with their tools' caches),
/// not inside another skipped directory; links are not followed.
fn find(
    top: &Path,
    rel: &Path,
    filter: &TreeFilter,
    out: &mut Vec<(PathBuf, &'static [&'static str])>,
) -> io::Result<()> {
    for entry in fs::read_dir(top.join(rel))? {
        let entry = entry?;
        let kind = entry.file_type()?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = rel.join(&*name);
        match consort_actors::dependency_caches(&name) {
            // A dependency directory may be a link (`.venv` → `~/.venvs/shop`).
            Some(caches) if kind.is_dir() || entry.path().is_dir() => out.push((path, caches)),
            None if kind.is_dir() && !filter.skips(&name) => find(top, &path, filter, out)?,
            _ => {}
        }
    }
    Ok(())
}

/// Makes `ours` a directory of links to the entries of `theirs`, the tools' `caches` left
/// out (or, when `theirs` is a link, a link to it: read-only to runs as a whole); a link or
/// file already at `ours` is left as it is.
fn mirror(theirs: &Path, ours: &Path, caches: &[&str]) -> io::Result<usize> {
    if fs::symlink_metadata(theirs)?.is_symlink() {
        if fs::symlink_metadata(ours).is_ok() {
            return Ok(0);
        }
        std::os::unix::fs::symlink(theirs, ours)?;
        return Ok(1);
    }
    // A directory made now holds nothing to keep or to clear.
    let fresh = match fs::symlink_metadata(ours) {
        Ok(meta) if meta.is_dir() => false,
        Ok(_) => return Ok(0),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir(ours)?;
            true
        }
        Err(e) => return Err(e),
    };
    if !fresh {
        for entry in fs::read_dir(ours)? {
            let at = entry?.path();
            let stale = fs::read_link(&at).is_ok_and(|to| to.starts_with(theirs) && !at.exists());
            if stale {
                fs::remove_file(&at)?;
            }
        }
    }
    let mut linked = 0;
    for entry in fs::read_dir(theirs)? {
        let entry = entry?;
        let name = entry.file_name();
        let at = ours.join(&name);
        if caches.iter().any(|c| name == **c) || (!fresh && fs::symlink_metadata(&at).is_ok()) {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), &at)?;
        linked += 1;
    }
    Ok(linked)
}

/// The installs in the virtual environments of the tree at `project_top` that point back into
/// that tree (an editable install of the project itself: a `.pth` line, or setuptools' editable
/// finder, naming a directory of the tree): what a lane linking that environment would import
/// instead of its own files. Each is named by its file, relative to the tree.
pub fn editable_installs(project_top: &Path) -> Vec<String> {
    let Ok(top) = project_top.canonicalize() else {
        return Vec::new();
    };
    let mut found = Vec::new();
    // `lib64` is often a link to `lib`: each site-packages directory once.
    let mut sites = std::collections::BTreeSet::new();
    for lib in ["lib", "lib64"] {
        let Ok(pythons) = fs::read_dir(top.join(".venv").join(lib)) else {
            continue;
        };
        for site in pythons.flatten().map(|p| p.path().join("site-packages")) {
            if !site.canonicalize().is_ok_and(|real| sites.insert(real)) {
                continue;
            }
            let Ok(files) = fs::read_dir(&site) else {
                continue;
            };
            for file in files.flatten().map(|f| f.path()) {
                let name = file.file_name().map(|n| n.to_string_lossy().into_owned());
                let Some(name) = name else { continue };
                let editable_finder = name.starts_with("__editable__") && name.ends_with(".py");
                if !(name.ends_with(".pth") || editable_finder) {
                    continue;
                }
                let Ok(text) = fs::read_to_string(&file) else {
                    continue;
                };
                if names_a_directory_of(&text, &top) {
                    let shown = file.strip_prefix(&top).unwrap_or(&file);
                    found.push(shown.display().to_string());
                }
            }
        }
    }
    found.sort();
    found.dedup();
    found
}

/// Whether `text` (a `.pth` file, an editable finder) names a directory inside `top`, outside
/// its virtual environment.
fn names_a_directory_of(text: &str, top: &Path) -> bool {
    let venv = top.join(".venv");
    text.split(['\n', '\'', '"'])
        .map(str::trim)
        .filter(|word| word.starts_with('/'))
        .map(Path::new)
        .any(|p| p.starts_with(top) && !p.starts_with(&venv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(path: &Path) {
        fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
        fs::write(path, "x").expect("write");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .expect("list")
            .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_lane_gets_links_to_the_projects_dependencies_and_caches_of_its_own() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (project, lane) = (tmp.path().join("shop"), tmp.path().join("lane"));
        touch(&project.join("node_modules/vitest/index.js"));
        touch(&project.join("node_modules/.bin/vitest"));
        touch(&project.join("node_modules/.vite/results.json"));
        touch(&project.join("web/node_modules/pg/index.js"));
        touch(&project.join("tools/node_modules/x/index.js"));
        touch(&project.join(".venv/pyvenv.cfg"));
        touch(&project.join("target/node_modules/never/index.js"));
        fs::create_dir_all(lane.join("web")).expect("the lane's web");
        touch(&lane.join("tools/node_modules/x/index.js"));
        fs::remove_file(lane.join("tools/node_modules/x/index.js")).expect("rm");

        let linked = link_dependencies(&project, &lane).expect("linked");
        assert_eq!(names(&lane.join("node_modules")), [".bin", "vitest"]);
        assert!(lane.join("node_modules").is_dir() && !lane.join("node_modules").is_symlink());
        assert_eq!(
            fs::read_link(lane.join("node_modules/vitest")).expect("a link"),
            project.join("node_modules/vitest")
        );
        assert!(lane.join("web/node_modules/pg/index.js").is_file());
        assert!(lane.join(".venv/pyvenv.cfg").is_file());
        assert!(
            !lane.join("target").exists(),
            "no dependency inside a cache"
        );
        // The lane's own entry is left as it is.
        assert!(!lane.join("tools/node_modules/x").is_symlink());
        assert_eq!(linked, 4);

        // The project installs one package and removes another: the lane follows.
        touch(&project.join("node_modules/left-pad/index.js"));
        fs::remove_dir_all(project.join("node_modules/vitest")).expect("rm");
        assert_eq!(link_dependencies(&project, &lane).expect("again"), 1);
        assert_eq!(names(&lane.join("node_modules")), [".bin", "left-pad"]);
    }

    #[test]
    fn an_editable_install_of_the_project_is_found_and_an_ordinary_one_is_not() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let top = tmp.path().canonicalize().expect("canonical");
        let site = top.join(".venv/lib/python3.12/site-packages");
        fs::create_dir_all(top.join("src/shop")).expect("src");
        fs::create_dir_all(&site).expect("site");
        let write = |name: &str, text: String| fs::write(site.join(name), text).expect("write");
        write(
            "distutils-precedence.pth",
            "import os; var = 'SETUPTOOLS'\n".into(),
        );
        write("other.pth", "/usr/lib/python3/dist-packages\n".into());
        write("venv-own.pth", format!("{}\n", site.display()));
        assert!(
            editable_installs(&top).is_empty(),
            "nothing points into the tree"
        );
        write(
            "__editable__.shop-1.0.pth",
            format!("{}\n", top.join("src").display()),
        );
        write(
            "__editable___shop_1_0_finder.py",
            format!(
                "MAPPING = {{'shop': '{}'}}\n",
                top.join("src/shop").display()
            ),
        );
        assert_eq!(
            editable_installs(&top),
            [
                ".venv/lib/python3.12/site-packages/__editable__.shop-1.0.pth",
                ".venv/lib/python3.12/site-packages/__editable___shop_1_0_finder.py",
            ]
        );
    }

    #[test]
    fn a_linked_virtual_environment_is_linked_whole() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let (project, lane) = (tmp.path().join("shop"), tmp.path().join("lane"));
        touch(&tmp.path().join("venvs/shop/pyvenv.cfg"));
        fs::create_dir_all(&project).expect("project");
        fs::create_dir_all(&lane).expect("lane");
        std::os::unix::fs::symlink(tmp.path().join("venvs/shop"), project.join(".venv"))
            .expect("link");
        assert_eq!(link_dependencies(&project, &lane).expect("linked"), 1);
        assert!(lane.join(".venv").is_symlink());
        assert!(lane.join(".venv/pyvenv.cfg").is_file());
    }
}
