//! The per-step transcript of an external program: what ran, how it ended, its stderr and its
//! stdout, kept whether the program succeeded or not (`consort` keeps them in
//! `.consort/transcripts/`).

use std::path::{Path, PathBuf};

use consort_actors::PathIoError;

use super::CommandError;

/// The most bytes of each stream a transcript keeps (the rest is counted, not kept).
pub const TRANSCRIPT_STREAM_CAP: usize = 256 * 1024;

/// The transcript file name of a step and attempt: the step key with every character other
/// than letters, digits, `.` and `-` made `_`, then `-<attempt>.txt` (`green/T1`, attempt 0:
/// `green_T1-0.txt`).
pub fn transcript_file_name(step_key: &str, attempt: u32) -> String {
    format!("{}.txt", transcript_stem(step_key, attempt))
}

/// The name of a step's transcripts without the extension (`green_T1-0`): the command
/// backend's `.txt`, the OpenAI backend's `.tools.json`.
pub(crate) fn transcript_stem(step_key: &str, attempt: u32) -> String {
    let safe: String = step_key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '.' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("{safe}-{attempt}")
}

/// One run, as the transcript tells it.
pub(crate) struct Record<'a> {
    pub step: String,
    pub attempt: u32,
    pub role: &'a str,
    pub program: &'a str,
    /// The argument template (`{prompt}` stands for the prompt below).
    pub args: &'a [String],
    pub prompt: Option<&'a str>,
    pub outcome: String,
    pub wall_ms: u64,
    pub stderr: &'a [u8],
    pub stdout: &'a [u8],
}

impl Record<'_> {
    fn render(&self) -> String {
        let mut t = format!(
            "step: {}\nattempt: {}\nrole: {}\nprogram: {}\nargs: {}\noutcome: {}\nwall: {} ms\n",
            self.step,
            self.attempt,
            self.role,
            self.program,
            self.args.join(" "),
            self.outcome,
            self.wall_ms
        );
        if let Some(p) = self.prompt {
            t.push_str(&format!("\n--- prompt ({} bytes) ---\n{p}\n", p.len()));
        }
        section(&mut t, "stderr", self.stderr);
        section(&mut t, "stdout", self.stdout);
        t
    }
}

fn section(t: &mut String, name: &str, bytes: &[u8]) {
    let kept = &bytes[..bytes.len().min(TRANSCRIPT_STREAM_CAP)];
    t.push_str(&format!("\n--- {name} ({} bytes) ---\n", bytes.len()));
    t.push_str(&String::from_utf8_lossy(kept));
    if kept.len() < bytes.len() {
        t.push_str(&format!(
            "\n[{} more bytes not kept]",
            bytes.len() - kept.len()
        ));
    }
    if !t.ends_with('\n') {
        t.push('\n');
    }
}

/// Writes the transcript into `dir` (created when missing); returns its path.
pub(crate) fn write(dir: &Path, record: &Record<'_>) -> Result<PathBuf, CommandError> {
    let io_err = |op, p: &Path| PathIoError::at(op, p.display().to_string());
    std::fs::create_dir_all(dir).map_err(io_err("create transcript directory", dir))?;
    let path = dir.join(transcript_file_name(&record.step, record.attempt));
    std::fs::write(&path, record.render()).map_err(io_err("write transcript", &path))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_plain_and_streams_are_capped() {
        assert_eq!(transcript_file_name("review/T1/0", 2), "review_T1_0-2.txt");
        assert_eq!(transcript_file_name("spec/r0", 0), "spec_r0-0.txt");
        let big = vec![b'x'; TRANSCRIPT_STREAM_CAP + 10];
        let r = Record {
            step: "green/T1".into(),
            attempt: 0,
            role: "driver",
            program: "claude",
            args: &["-p".into(), "{prompt}".into()],
            prompt: Some("do it"),
            outcome: "exit code 0".into(),
            wall_ms: 5,
            stderr: b"warning: slow\n",
            stdout: &big,
        };
        let text = r.render();
        assert!(
            text.contains("--- stderr (14 bytes) ---\nwarning: slow\n"),
            "{text}"
        );
        assert!(text.contains("[10 more bytes not kept]"));
        assert!(text.contains("args: -p {prompt}\n"));
    }
}
