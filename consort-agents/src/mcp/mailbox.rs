//! The mailbox between a parked assignment (the `mcp` backend, inside `consort run`) and the MCP
//! sessions that play it (`consort mcp`): one directory of small JSON files, each written
//! atomically (a temporary file in the same directory, renamed into place), so a reader sees a
//! whole file or none, and nothing is lost when either process is killed.
//!
//! Per assignment id `N`:
//!
//! - `aN.assignment.json` ([`Parked`]): written by the run when the role's step is assigned.
//! - `aN.taken.json` ([`Taken`]): the first MCP identity that took it (created exclusively: a
//!   second identity cannot take it).
//! - `aN.submission.json` ([`Submission`]): the latest answer, numbered by `seq`.
//! - `aN.verdict.json` ([`Verdict`]): the run's judgement of submission `seq`; `closed` once
//!   the assignment is answered for good (accepted, or refused past the retry bound).
//!
//! Everything read here is untrusted: a malformed file is a [`MailboxError::Malformed`] naming
//! it, never a panic.

use std::io::Write;
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use consort_actors::{Assignment, Role, Step};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What can go wrong with the mailbox.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MailboxError {
    /// A file could not be read or written.
    #[error("mailbox file {path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// A file is not what the mailbox writes.
    #[error("mailbox file {path} is malformed: {detail}")]
    Malformed {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
    /// An identity is not a plain name.
    #[error(
        "\"{0}\" is no usable identity: use 1 to 64 letters, digits, '.', '_' or '-' (for example `--as alice`)"
    )]
    BadIdentity(String),
    /// Another identity took the assignment first.
    #[error("assignment {id} ({step}) was taken by {by}; only that identity may answer it")]
    TakenByOther {
        /// The assignment id.
        id: u64,
        /// Its step.
        step: String,
        /// Who took it.
        by: String,
    },
    /// The assignment is not (or no longer) waiting for an answer.
    #[error("assignment {id} is not waiting for an answer (the run has moved on, or it never was)")]
    NotWaiting {
        /// The assignment id.
        id: u64,
    },
}

/// An assignment parked for an MCP client.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Parked {
    /// The assignment id.
    pub id: u64,
    /// The role asked.
    pub role: Role,
    /// The step key (`green/T1`).
    pub step: String,
    /// 0 for the first try.
    pub attempt: u32,
    /// When it was parked.
    pub parked_at: DateTime<Utc>,
    /// The artifact kind the answer must be (`change-set`, `review-verdict`, …).
    pub answer_with: String,
    /// How many refused submissions the run accepts before the step fails.
    pub max_refusals: u32,
    /// The assignment as JSON, as a plain command reads it on stdin (the role's prompt, the
    /// step, the inputs, the feedback, the answer's schema).
    pub assignment: Value,
}

impl Parked {
    /// The parked step, parsed.
    pub fn step(&self) -> Result<Step, String> {
        self.step.parse::<Step>().map_err(|e| e.to_string())
    }
}

/// Who took an assignment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Taken {
    /// The MCP session's identity.
    pub identity: String,
    /// When.
    pub at: DateTime<Utc>,
}

/// An answer handed over by an MCP session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Submission {
    /// The assignment it answers.
    pub assignment: u64,
    /// 1 for the first submission, counting up.
    pub seq: u32,
    /// Who submitted it.
    pub identity: String,
    /// When.
    pub at: DateTime<Utc>,
    /// The artifact, untrusted JSON (tagged `{kind, body}` or the bare body).
    pub artifact: Value,
}

/// The run's judgement of one submission.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// The assignment.
    pub assignment: u64,
    /// The submission judged.
    pub seq: u32,
    /// Who submitted it.
    pub identity: String,
    /// Whether it passed every check the agent side makes (the machine's own rules).
    pub accepted: bool,
    /// Why it was refused, word for word.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Refused submissions the run still accepts for this assignment.
    pub refusals_left: u32,
    /// No further submission is taken for this assignment.
    pub closed: bool,
}

/// One mailbox directory (a feature's `.consort/features/<id>/mcp/`).
#[derive(Debug, Clone)]
pub struct Mailbox {
    dir: PathBuf,
}

/// Checks that `identity` is a plain name.
pub fn check_identity(identity: &str) -> Result<(), MailboxError> {
    let ok = !identity.is_empty()
        && identity.len() <= 64
        && identity
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'));
    if ok {
        Ok(())
    } else {
        Err(MailboxError::BadIdentity(identity.to_string()))
    }
}

impl Mailbox {
    /// The mailbox in `dir` (created when something is first written).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Mailbox { dir: dir.into() }
    }

    /// The directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn path(&self, id: u64, what: &str) -> PathBuf {
        self.dir.join(format!("a{id}.{what}.json"))
    }

    /// Parks `assignment` (rewriting the file when the same id is parked again on resume).
    pub fn park(&self, assignment: &Assignment, max_refusals: u32) -> Result<Parked, MailboxError> {
        let parked = Parked {
            id: assignment.id.0,
            role: assignment.role,
            step: assignment.step.to_string(),
            attempt: assignment.attempt,
            parked_at: Utc::now(),
            answer_with: assignment.expected_kind().to_string(),
            max_refusals,
            assignment: crate::mcp::assignment_json(assignment),
        };
        self.write(&self.path(parked.id, "assignment"), &parked)?;
        Ok(parked)
    }

    /// The parked assignment `id`, if any.
    pub fn parked(&self, id: u64) -> Result<Option<Parked>, MailboxError> {
        self.read(&self.path(id, "assignment"))
    }

    /// Every parked assignment, by id (the closed ones too).
    pub fn all_parked(&self) -> Result<Vec<Parked>, MailboxError> {
        let mut ids = Vec::new();
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(source) => {
                return Err(MailboxError::Io {
                    path: self.dir.clone(),
                    source,
                });
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if let Some(id) = name
                .strip_prefix('a')
                .and_then(|n| n.strip_suffix(".assignment.json"))
                .and_then(|n| n.parse::<u64>().ok())
            {
                ids.push(id);
            }
        }
        ids.sort_unstable();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            if let Some(p) = self.parked(id)? {
                out.push(p);
            }
        }
        Ok(out)
    }

    /// Who took assignment `id`, if anyone.
    pub fn taken(&self, id: u64) -> Result<Option<Taken>, MailboxError> {
        self.read(&self.path(id, "taken"))
    }

    /// Takes assignment `id` for `identity`: the first identity to take it keeps it; the same
    /// identity taking it again is answered the same.
    pub fn take(&self, parked: &Parked, identity: &str) -> Result<Taken, MailboxError> {
        check_identity(identity)?;
        let path = self.path(parked.id, "taken");
        let taken = Taken {
            identity: identity.to_string(),
            at: Utc::now(),
        };
        let bytes = encode(&path, &taken)?;
        let tmp = self.temp(&path, &bytes)?;
        match tmp.persist_noclobber(&path) {
            Ok(_) => Ok(taken),
            Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => {
                match self.taken(parked.id)? {
                    Some(t) if t.identity == identity => Ok(t),
                    Some(t) => Err(MailboxError::TakenByOther {
                        id: parked.id,
                        step: parked.step.clone(),
                        by: t.identity,
                    }),
                    None => Err(MailboxError::NotWaiting { id: parked.id }),
                }
            }
            Err(e) => Err(MailboxError::Io {
                path,
                source: e.error,
            }),
        }
    }

    /// The latest submission for `id`, if any.
    pub fn submission(&self, id: u64) -> Result<Option<Submission>, MailboxError> {
        self.read_of(id, "submission", "answers", |s: &Submission| s.assignment)
    }

    /// Hands over `artifact` for assignment `id` from `identity` (who must have taken it);
    /// returns the submission's number. Refused when the assignment is closed.
    pub fn submit(&self, id: u64, identity: &str, artifact: Value) -> Result<u32, MailboxError> {
        check_identity(identity)?;
        let parked = self.parked(id)?.ok_or(MailboxError::NotWaiting { id })?;
        match self.taken(id)? {
            Some(t) if t.identity == identity => {}
            Some(t) => {
                return Err(MailboxError::TakenByOther {
                    id,
                    step: parked.step,
                    by: t.identity,
                });
            }
            None => {
                self.take(&parked, identity)?;
            }
        }
        let verdict = self.verdict(id)?;
        if verdict.as_ref().is_some_and(|v| v.closed) {
            return Err(MailboxError::NotWaiting { id });
        }
        // A torn or foreign submission file is replaced.
        let last = match self.submission(id) {
            Ok(s) => s.map_or(0, |s| s.seq),
            Err(MailboxError::Malformed { .. }) => 0,
            Err(e) => return Err(e),
        };
        let seq = last.max(verdict.map_or(0, |v| v.seq)) + 1;
        let sub = Submission {
            assignment: id,
            seq,
            identity: identity.to_string(),
            at: Utc::now(),
            artifact,
        };
        self.write(&self.path(id, "submission"), &sub)?;
        Ok(seq)
    }

    /// The run's latest verdict for `id`, if any.
    pub fn verdict(&self, id: u64) -> Result<Option<Verdict>, MailboxError> {
        self.read_of(id, "verdict", "judges", |v: &Verdict| v.assignment)
    }

    /// Records the run's verdict.
    pub fn record_verdict(&self, verdict: &Verdict) -> Result<(), MailboxError> {
        self.write(&self.path(verdict.assignment, "verdict"), verdict)
    }

    /// The identities whose accepted answers wrote test `test`'s code (its GREEN, repairs
    /// and refactors): none of them may review it.
    pub fn code_authors(&self, test: &str) -> Result<Vec<String>, MailboxError> {
        let mut authors = Vec::new();
        for p in self.all_parked()? {
            let writes_code = matches!(
                p.step(),
                Ok(Step::Green { test: t } | Step::Repair { test: t, .. } | Step::Refactor { test: t, .. })
                    if t == test
            );
            if !writes_code {
                continue;
            }
            let accepted = self.verdict(p.id)?.filter(|v| v.accepted);
            let taker = self.taken(p.id)?.map(|t| t.identity);
            for who in accepted.map(|v| v.identity).into_iter().chain(taker) {
                if !authors.contains(&who) {
                    authors.push(who);
                }
            }
        }
        Ok(authors)
    }

    /// The `kind` file of assignment `id`, if any: malformed when it belongs to another
    /// assignment (`assignment` reads which; `verb` says how the file relates to it).
    fn read_of<T: DeserializeOwned>(
        &self,
        id: u64,
        kind: &str,
        verb: &str,
        assignment: impl Fn(&T) -> u64,
    ) -> Result<Option<T>, MailboxError> {
        let path = self.path(id, kind);
        match self.read::<T>(&path)? {
            Some(record) if assignment(&record) != id => Err(MailboxError::Malformed {
                detail: format!("it {verb} assignment {}, not {id}", assignment(&record)),
                path,
            }),
            other => Ok(other),
        }
    }

    fn read<T: DeserializeOwned>(&self, path: &Path) -> Result<Option<T>, MailboxError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(MailboxError::Io {
                    path: path.to_path_buf(),
                    source,
                });
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| MailboxError::Malformed {
                path: path.to_path_buf(),
                detail: e.to_string(),
            })
    }

    fn write<T: Serialize>(&self, path: &Path, value: &T) -> Result<(), MailboxError> {
        let bytes = encode(path, value)?;
        let tmp = self.temp(path, &bytes)?;
        tmp.persist(path).map_err(|e| MailboxError::Io {
            path: path.to_path_buf(),
            source: e.error,
        })?;
        Ok(())
    }

    /// A synced temporary file in the mailbox holding `bytes`, to be renamed to `path`.
    fn temp(&self, path: &Path, bytes: &[u8]) -> Result<tempfile::NamedTempFile, MailboxError> {
        let io = |source| MailboxError::Io {
            path: path.to_path_buf(),
            source,
        };
        std::fs::create_dir_all(&self.dir).map_err(io)?;
        let mut tmp = tempfile::Builder::new()
            .prefix(".tmp-")
            .tempfile_in(&self.dir)
            .map_err(io)?;
        tmp.write_all(bytes).map_err(io)?;
        tmp.as_file().sync_all().map_err(io)?;
        Ok(tmp)
    }
}

fn encode<T: Serialize>(path: &Path, value: &T) -> Result<Vec<u8>, MailboxError> {
    serde_json::to_vec_pretty(value).map_err(|e| MailboxError::Malformed {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}
