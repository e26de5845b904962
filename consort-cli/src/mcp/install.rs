//! `consort mcp install CLIENT`: writes a coding client's project configuration so that it
//! starts `consort mcp` for this project, in the shape each client documents:
//!
//! | client | file | shape |
//! |---|---|---|
//! | Claude Code | `.mcp.json` | `{"mcpServers": {NAME: {"type": "stdio", "command", "args"}}}` |
//! | Cursor | `.cursor/mcp.json` | `{"mcpServers": {NAME: {"command", "args"}}}` |
//! | Codex | `.codex/config.toml` (a trusted project's) | `[mcp_servers.NAME]` with `command` and `args` |
//!
//! The entry is merged into what is there: every other key, entry (in its order) and, in TOML,
//! comment of the user's stays as it was. An entry of the same name that differs from
//! Consort's is refused, never replaced; a file that does not parse is refused, never
//! rewritten. The file is replaced atomically.

use std::path::{Path, PathBuf};

use indexmap::IndexMap;
use serde::{Deserialize, Serialize};

/// A coding client whose configuration `consort mcp install` writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Client {
    /// Claude Code: the project's `.mcp.json`.
    Claude,
    /// Cursor: the project's `.cursor/mcp.json`.
    Cursor,
    /// Codex: the project's `.codex/config.toml` (read in a project Codex trusts).
    Codex,
}

impl Client {
    /// The configuration file, relative to the project.
    pub fn file(self) -> &'static str {
        match self {
            Client::Claude => ".mcp.json",
            Client::Cursor => ".cursor/mcp.json",
            Client::Codex => ".codex/config.toml",
        }
    }

    /// The client's name, for people.
    pub fn label(self) -> &'static str {
        match self {
            Client::Claude => "Claude Code",
            Client::Cursor => "Cursor",
            Client::Codex => "Codex",
        }
    }

    /// The identity a session of this client plays as by default.
    pub fn identity(self) -> &'static str {
        match self {
            Client::Claude => "claude",
            Client::Cursor => "cursor",
            Client::Codex => "codex",
        }
    }
}

/// The server entry to write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerEntry {
    /// The entry's name in the client's table of servers.
    pub name: String,
    /// The program the client starts (`consort`, or a path to it).
    pub command: String,
    /// Its arguments (`mcp --dir . --as IDENTITY`).
    pub args: Vec<String>,
}

impl ServerEntry {
    /// Consort's entry for `client`: `consort mcp --dir . --as IDENTITY`, started by `command`.
    pub fn for_client(client: Client, name: &str, command: &str, identity: Option<&str>) -> Self {
        let identity = identity.unwrap_or(client.identity());
        ServerEntry {
            name: name.to_string(),
            command: command.to_string(),
            args: ["mcp", "--dir", ".", "--as", identity]
                .map(str::to_string)
                .to_vec(),
        }
    }

    /// The command line the client runs, for people.
    pub fn command_line(&self) -> String {
        std::iter::once(self.command.as_str())
            .chain(self.args.iter().map(String::as_str))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// What `install` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The entry was added (the file made when there was none).
    Added,
    /// The same entry was there already; nothing was written.
    AlreadyThere,
}

/// Why the configuration was not written. Nothing was written in every case.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum InstallError {
    /// The file exists but cannot be read.
    #[error("cannot read {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The file does not parse.
    #[error("{} is not valid {format} ({detail}); nothing was written", path.display())]
    Parse {
        /// The file.
        path: PathBuf,
        /// JSON or TOML.
        format: &'static str,
        /// The parser's words.
        detail: String,
    },
    /// The key that holds the servers holds something else.
    #[error("{}: `{key}` is not a table of servers; nothing was written", path.display())]
    NotATable {
        /// The file.
        path: PathBuf,
        /// The key.
        key: &'static str,
    },
    /// A server of that name is there and differs from Consort's.
    #[error(
        "{} already has a server named `{name}` that differs from Consort's; it is yours, so nothing was written (remove it, or install under another name with --name)",
        path.display()
    )]
    Taken {
        /// The file.
        path: PathBuf,
        /// The entry's name.
        name: String,
    },
    /// The file could not be written.
    #[error("cannot write {}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Writes `entry` into `client`'s configuration in the project `dir`; returns the file and
/// what was done.
pub fn install(
    dir: &Path,
    client: Client,
    entry: &ServerEntry,
) -> Result<(PathBuf, Outcome), InstallError> {
    let path = dir.join(client.file());
    let existing = match std::fs::read_to_string(&path) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(source) => return Err(InstallError::Read { path, source }),
    };
    let merged = match client {
        Client::Claude | Client::Cursor => merge_json(existing.as_deref(), client, entry, &path)?,
        Client::Codex => merge_toml(existing.as_deref(), entry, &path)?,
    };
    let Some(text) = merged else {
        return Ok((path, Outcome::AlreadyThere));
    };
    write_atomically(&path, &text).map_err(|source| InstallError::Write {
        path: path.clone(),
        source,
    })?;
    Ok((path, Outcome::Added))
}

/// A JSON value that keeps its objects' keys in the order they were written.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum Ordered {
    Null,
    Bool(bool),
    Number(serde_json::Number),
    String(String),
    Array(Vec<Ordered>),
    Object(IndexMap<String, Ordered>),
}

/// The JSON shape both clients read: `mcpServers` by name. `None` when the same entry is
/// there already.
fn merge_json(
    text: Option<&str>,
    client: Client,
    entry: &ServerEntry,
    path: &Path,
) -> Result<Option<String>, InstallError> {
    let parse = |e: serde_json::Error| InstallError::Parse {
        path: path.to_path_buf(),
        format: "JSON",
        detail: e.to_string(),
    };
    let mut top = match text.filter(|t| !t.trim().is_empty()) {
        None => IndexMap::new(),
        Some(t) => match serde_json::from_str::<Ordered>(t).map_err(parse)? {
            Ordered::Object(map) => map,
            _ => {
                return Err(InstallError::NotATable {
                    path: path.to_path_buf(),
                    key: "(the whole file)",
                });
            }
        },
    };
    let servers = top
        .entry("mcpServers".to_string())
        .or_insert_with(|| Ordered::Object(IndexMap::new()));
    let Ordered::Object(servers) = servers else {
        return Err(InstallError::NotATable {
            path: path.to_path_buf(),
            key: "mcpServers",
        });
    };
    let mut ours = IndexMap::new();
    if client == Client::Claude {
        ours.insert("type".to_string(), Ordered::String("stdio".to_string()));
    }
    ours.insert(
        "command".to_string(),
        Ordered::String(entry.command.clone()),
    );
    let args = entry.args.iter().cloned().map(Ordered::String).collect();
    ours.insert("args".to_string(), Ordered::Array(args));
    let ours = Ordered::Object(ours);
    if let Some(theirs) = servers.get(&entry.name) {
        let same = serde_json::to_value(theirs).map_err(parse)?
            == serde_json::to_value(&ours).map_err(parse)?;
        return if same {
            Ok(None)
        } else {
            Err(taken(path, entry))
        };
    }
    servers.insert(entry.name.clone(), ours);
    let text = serde_json::to_string_pretty(&Ordered::Object(top)).map_err(parse)?;
    Ok(Some(text + "\n"))
}

/// Codex's `[mcp_servers.NAME]`, merged with the file's comments and layout kept. `None`
/// when the same entry is there already.
fn merge_toml(
    text: Option<&str>,
    entry: &ServerEntry,
    path: &Path,
) -> Result<Option<String>, InstallError> {
    // No file yet: an empty document.
    let mut doc: toml_edit::DocumentMut =
        text.unwrap_or("")
            .parse()
            .map_err(|e: toml_edit::TomlError| InstallError::Parse {
                path: path.to_path_buf(),
                format: "TOML",
                detail: e.message().to_string(),
            })?;
    let not_a_table = || InstallError::NotATable {
        path: path.to_path_buf(),
        key: "mcp_servers",
    };
    let servers = doc
        .entry("mcp_servers")
        .or_insert_with(|| {
            let mut t = toml_edit::Table::new();
            t.set_implicit(true);
            toml_edit::Item::Table(t)
        })
        .as_table_like_mut()
        .ok_or_else(not_a_table)?;
    if let Some(theirs) = servers.get(&entry.name) {
        return if toml_entry_is(theirs, entry) {
            Ok(None)
        } else {
            Err(taken(path, entry))
        };
    }
    let mut ours = toml_edit::Table::new();
    ours.insert("command", toml_edit::value(entry.command.as_str()));
    let args: toml_edit::Array = entry.args.iter().map(String::as_str).collect();
    ours.insert("args", toml_edit::value(args));
    servers.insert(&entry.name, toml_edit::Item::Table(ours));
    Ok(Some(doc.to_string()))
}

/// Whether a Codex server entry is exactly `command` and `args` as Consort writes them.
fn toml_entry_is(item: &toml_edit::Item, entry: &ServerEntry) -> bool {
    let Some(t) = item.as_table_like() else {
        return false;
    };
    let args: Option<Vec<&str>> = t
        .get("args")
        .and_then(|a| a.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str()).collect());
    t.len() == 2
        && t.get("command").and_then(|c| c.as_str()) == Some(entry.command.as_str())
        && args.is_some_and(|a| a == entry.args)
}

fn taken(path: &Path, entry: &ServerEntry) -> InstallError {
    InstallError::Taken {
        path: path.to_path_buf(),
        name: entry.name.clone(),
    }
}

/// Writes `text` to `path` through a temporary file beside it, renamed over it; a file that
/// was there keeps its permissions.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let mut tmp = tempfile::NamedTempFile::new_in(parent)?;
    let permissions = match std::fs::metadata(path) {
        Ok(m) => m.permissions(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::os::unix::fs::PermissionsExt::from_mode(0o644)
        }
        Err(e) => return Err(e),
    };
    tmp.as_file().set_permissions(permissions)?;
    std::io::Write::write_all(&mut tmp, text.as_bytes())?;
    tmp.as_file().sync_all()?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests;
