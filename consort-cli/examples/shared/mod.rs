//! What the command line's examples share: their `main`, and the project directory they run
//! in. Each example includes this file with `#[path = "../shared/mod.rs"] mod shared;`.

use std::path::PathBuf;

use anyhow::{Context, Result};
use consort_cli::ui;

/// Runs an example's `run` and exits with its code; on an error, prints the error's chain and
/// exits with the failure code.
pub(crate) fn main(run: impl FnOnce() -> Result<i32>) -> ! {
    let code = run().unwrap_or_else(|e| {
        eprintln!("error: {}", consort::actors::error_chain(e.as_ref()));
        ui::EXIT_FAILURE
    });
    std::process::exit(code);
}

/// The example's project directory, made and canonical: `dir`, or a fresh
/// `consort-NAME-PID` under the temporary directory.
pub(crate) fn project_dir(dir: Option<PathBuf>, name: &str) -> Result<PathBuf> {
    let dir = dir.unwrap_or_else(|| {
        std::env::temp_dir().join(format!("consort-{name}-{}", std::process::id()))
    });
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir.canonicalize()?)
}
