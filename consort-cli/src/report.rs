//! `consort report`: one self-contained HTML page per feature, rendered from its ledger
//! (replayed) and its frozen design. No network, no external fonts or scripts: inline CSS
//! only, so the file works from `file://` and can be mailed or archived as it is.
//!
//! [`render`] is the page as a string (what `consort serve` builds on: it re-fetches itself
//! with [`RenderOptions::live_refresh_secs`] and carries the caller's
//! [`RenderOptions::banner_html`]); [`write()`] puts it in a file, by default
//! [`default_path`] in the feature's record directory. Every text that comes from an agent, a
//! test run, a configuration or a person goes through [`escape`].

mod html;
mod lifecycle;
mod model;
mod sections;
mod timeline;

use std::path::{Path, PathBuf};

pub use html::escape;

use consort::project::{Project, ProjectError};

/// How to render a report.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RenderOptions {
    /// When set, the page asks the browser to load it again every this many seconds (a
    /// `<meta http-equiv="refresh">`, which works from `file://` and from a server alike).
    pub live_refresh_secs: Option<u32>,
    /// Trusted HTML the caller supplies, inserted as it is at the top of the body (an
    /// approval panel, a notice). Never escaped: it must not carry untrusted text unescaped.
    pub banner_html: Option<String>,
}

/// What can keep a report from being rendered or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReportError {
    /// The feature's run has not started: its ledger has no entry to report on.
    #[error(
        "the run of feature {feature} has not started (its ledger is empty); start it with `consort run`"
    )]
    NotStarted {
        /// The feature's id.
        feature: String,
    },
    /// The project or its state could not be read.
    #[error(transparent)]
    Project(#[from] ProjectError),
    /// The ledger could not be read or verified.
    #[error(transparent)]
    Ledger(#[from] consort_actors::LedgerError),
    /// The report file could not be written.
    #[error("cannot write the report {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// The report of `project`'s feature as one self-contained HTML page.
pub fn render(project: &Project, opts: &RenderOptions) -> Result<String, ReportError> {
    let model = model::Model::read(project)?;
    Ok(html::page(&model, opts))
}

/// Where the report of `project`'s feature goes by default: `report.html` beside its ledger
/// (`.consort/features/<id>/report.html`, or `.consort/report.html` for a project made before
/// backlogs).
pub fn default_path(project: &Project) -> PathBuf {
    let ledger = project.ledger_path();
    ledger.parent().map_or_else(
        || project.dir.join("report.html"),
        |d| d.join("report.html"),
    )
}

/// Renders the report and writes it to `out` (None: [`default_path`]), making its directory
/// if needed; returns the path written.
pub fn write(
    project: &Project,
    opts: &RenderOptions,
    out: Option<&Path>,
) -> Result<PathBuf, ReportError> {
    let page = render(project, opts)?;
    let path = out.map_or_else(|| default_path(project), Path::to_path_buf);
    let failed = |source| ReportError::Write {
        path: path.clone(),
        source,
    };
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(failed)?;
    }
    std::fs::write(&path, page).map_err(failed)?;
    Ok(path)
}
