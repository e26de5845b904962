//! Test tools at the versions people use, installed once per build directory from their
//! registries (npm, PyPI) under `target/tmp/runner-matrix/`, for the runner conformance tests.
//! A Node project links its `node_modules` to one; a Python project runs with a virtual
//! environment's `bin` first on `PATH`, as a user with that environment activated does.

use std::path::{Path, PathBuf};
use std::process::Command;

use consort_testkit::process::text;

/// Checks that the machine's `python3` runs `import IMPORTS`; `what` names what the test needs
/// and how to get it.
pub(crate) fn python3_imports(imports: &str, what: &str) {
    consort_testkit::process::succeeded(
        Command::new("python3").args(["-c", &format!("import {imports}")]),
        what,
    );
}

/// Where the tool installs live.
fn root() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join("runner-matrix")
}

/// A Node toolchain: `packages` (name@range) installed with npm into its own directory;
/// returns that directory's `node_modules`. Installs only when `bin` is not there yet.
pub(crate) fn npm(name: &str, packages: &[&str], bin: &str) -> PathBuf {
    let dir = root().join(name);
    let modules = dir.join("node_modules");
    if modules.join(".bin").join(bin).exists() {
        return modules;
    }
    std::fs::create_dir_all(&dir).expect("toolchain dir");
    std::fs::write(
        dir.join("package.json"),
        format!(r#"{{"name":"{name}","version":"1.0.0","private":true}}"#),
    )
    .expect("package.json");
    let o = Command::new("npm")
        .args(["install", "--no-audit", "--no-fund", "--save-dev"])
        .args(packages)
        .current_dir(&dir)
        .output()
        .expect("npm (Node.js) must be installed for the runner conformance tests");
    assert!(o.status.success(), "npm install {packages:?}: {}", text(&o));
    modules
}

/// Puts the toolchain's `modules` into the project `dir` as `node_modules`: a real directory, as
/// `npm install` leaves it (a cache a run may write), made of hard links where the two share a
/// file system, else copied.
pub(crate) fn install_node_modules(modules: &Path, dir: &Path) {
    let target = dir.join("node_modules");
    let copy = |flags: &str| {
        Command::new("cp")
            .arg(flags)
            .arg(modules)
            .arg(&target)
            .output()
            .expect("cp")
    };
    if copy("-al").status.success() {
        return;
    }
    let _ = std::fs::remove_dir_all(&target);
    let o = copy("-a");
    assert!(o.status.success(), "cp -a node_modules: {}", text(&o));
}

/// A Python virtual environment with `packages` installed with pip; returns its `bin`.
/// Installs only when the environment cannot import `module` yet.
pub(crate) fn venv(name: &str, packages: &[&str], module: &str) -> PathBuf {
    venv_at(&root().join(name), packages, module)
}

/// pytest 8 with psycopg, the matrix's own environment of the two; returns its `bin`.
pub(crate) fn pytest8() -> PathBuf {
    venv(
        "pytest8",
        &["pytest==8.*", "psycopg[binary]"],
        "pytest, psycopg",
    )
}

/// [`venv`] at `dir` (a project's own `.venv`, say).
pub(crate) fn venv_at(dir: &Path, packages: &[&str], module: &str) -> PathBuf {
    let bin = dir.join("bin");
    let python = bin.join("python3");
    let ready = Command::new(&python)
        .args(["-c", &format!("import {module}")])
        .output()
        .is_ok_and(|o| o.status.success());
    if ready {
        return bin;
    }
    let o = Command::new("python3")
        .args(["-m", "venv"])
        .arg(dir)
        .output()
        .expect("python3");
    assert!(o.status.success(), "python3 -m venv: {}", text(&o));
    let o = Command::new(bin.join("pip"))
        .args(["install", "-q"])
        .args(packages)
        .output()
        .expect("pip");
    assert!(o.status.success(), "pip install {packages:?}: {}", text(&o));
    bin
}

/// `PATH` with `dir` first.
pub(crate) fn path_with(dir: &Path) -> std::ffi::OsString {
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&rest)))
        .expect("PATH")
}
