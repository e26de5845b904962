//! What the confinement refused a run: never a verdict.
//!
//! A test that fails because the sandbox stopped it (a connection, a path, a pty) says nothing
//! about the code: taking it for a RED would accept a test that can never pass, and taking it
//! at GREEN would charge the Driver for the sandbox. [`read`] looks through what a failed run
//! printed (its output and its failure messages) for the words runtimes use for such a refusal
//! and keeps only what the run's confinement explains:
//!
//! - a TCP connection refused by permission (`connect EACCES 127.0.0.1:34113`, Go's
//!   `connect: permission denied`): only Landlock's port rule refuses a connection so;
//! - the network outside the run's own (`ENETUNREACH`, `Network is unreachable`, a name that
//!   cannot be resolved because no DNS server is reachable: `EAI_AGAIN`, `Temporary failure in
//!   name resolution`), for a run that has a network of its own;
//! - a path named beside `permission denied`, `EACCES`, `EPERM`, `read-only file system` or
//!   `EROFS` that the confinement refuses and the file's own modes allow: one in Consort's
//!   private state, or one outside every directory the run may write while its owner may write
//!   it;
//! - no pty (`out of pty devices`, `openpty failed`, a pty call beside a permission error),
//!   where runs get no devpts instance of their own.
//!
//! The output is untrusted: code that prints a refusal it never met turns its run into a
//! harness fault, which stops the work for a person, names what was "refused", and passes
//! nothing.

use std::path::{Path, PathBuf};

use crate::error::Refusal;

/// What the confinement of a run allows, as [`read`] judges a refusal against it.
#[derive(Debug, Clone, Default)]
pub(crate) struct Reach {
    /// Consort's private state (canonical): never readable.
    pub hidden: Vec<PathBuf>,
    /// Where the run may write (canonical).
    pub writable: Vec<PathBuf>,
    /// The run's work tree, against which relative paths are read.
    pub tree: PathBuf,
    /// Whether the run had a network of its own (else Landlock's TCP port rule).
    pub own_network: bool,
    /// Whether the run had a devpts instance of its own.
    pub own_ptys: bool,
}

/// Words that say an access was refused by permission.
const PATH_REFUSALS: [&str; 6] = [
    "permission denied",
    "eacces",
    "eperm",
    "operation not permitted",
    "read-only file system",
    "erofs",
];

/// The first refusal of the confinement in `text` (what a failed run printed), if any.
pub(crate) fn read(text: &str, reach: &Reach) -> Option<Refusal> {
    if !reach.own_ptys && pty_refused(&text.to_ascii_lowercase()) {
        return Some(Refusal::Pty);
    }
    text.lines().find_map(|line| refusal_in(line, reach))
}

/// No pty could be opened: what Python's `pty` and the `sh` package say, or a pty call beside
/// a permission error (`os.openpty()` over `PermissionError`, which names no path).
fn pty_refused(lower: &str) -> bool {
    lower.contains("out of pty devices")
        || lower.contains("openpty failed")
        || (["openpty", "forkpty", "/dev/ptmx", "/dev/pts/"]
            .iter()
            .any(|w| lower.contains(w))
            && (lower.contains("permission denied") || lower.contains("eacces")))
}

fn refusal_in(line: &str, reach: &Reach) -> Option<Refusal> {
    let lower = line.to_ascii_lowercase();
    if !reach.own_network
        && let Some(address) = refused_connection(line, &lower)
    {
        return Some(Refusal::Connection { address });
    }
    if reach.own_network
        && let Some(address) = unreachable_network(line, &lower)
    {
        return Some(Refusal::Network { address });
    }
    if PATH_REFUSALS.iter().any(|w| lower.contains(w)) {
        return paths_in(line)
            .into_iter()
            .find_map(|p| refused_path(&p, reach));
    }
    None
}

/// `connect EACCES <address>` (Node) or `dial tcp <address>: connect: permission denied` (Go).
fn refused_connection(line: &str, lower: &str) -> Option<String> {
    if let Some(at) = line.find("connect EACCES ") {
        return Some(word_at(&line[at + "connect EACCES ".len()..]));
    }
    if lower.contains("connect: permission denied") {
        let at = lower.find("dial tcp ")?;
        let rest = &line[at + "dial tcp ".len()..];
        return Some(rest.split(": ").next().unwrap_or(rest).to_string());
    }
    None
}

/// An address outside the run's own network, or a name no DNS server could resolve.
fn unreachable_network(line: &str, lower: &str) -> Option<String> {
    for marker in ["connect ENETUNREACH ", "getaddrinfo EAI_AGAIN "] {
        if let Some(at) = line.find(marker) {
            return Some(word_at(&line[at + marker.len()..]));
        }
    }
    if lower.contains("network is unreachable")
        || lower.contains("temporary failure in name resolution")
    {
        let named = lower.find("dial tcp ").map(|at| {
            word_at(&line[at + "dial tcp ".len()..])
                .trim_end_matches(':')
                .to_string()
        });
        return Some(named.unwrap_or_else(|| "an address".into()));
    }
    None
}

fn word_at(s: &str) -> String {
    s.split(|c: char| c.is_whitespace() || c == '\'' || c == '"' || c == ',')
        .next()
        .unwrap_or("")
        .to_string()
}

/// The paths a line names: quoted strings, and bare words with a `/` in them that are no URL.
fn paths_in(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    for quote in ['\'', '"', '`'] {
        let mut parts = line.split(quote);
        parts.next();
        while let Some(inside) = parts.next() {
            out.push(inside.to_string());
            parts.next();
        }
    }
    for word in line.split(|c: char| c.is_whitespace() || c == ',' || c == '\'' || c == '"') {
        let word = word.trim_end_matches([':', ')', ';', '.']);
        if word.contains('/') && !word.contains("://") {
            out.push(word.to_string());
        }
    }
    out.retain(|p| !p.is_empty() && !p.contains('\0') && p.len() < 4096);
    out
}

/// The refusal `named` stands for, when the confinement explains it.
fn refused_path(named: &str, reach: &Reach) -> Option<Refusal> {
    let path = reach.tree.join(named);
    let real = resolved(&path)?;
    if reach.hidden.iter().any(|h| real.starts_with(h)) {
        return Some(Refusal::Path {
            path: named.to_string(),
            write: false,
        });
    }
    let writable = reach.writable.iter().any(|w| real.starts_with(w));
    (!writable && owner_may_write(&real)).then(|| Refusal::Path {
        path: named.to_string(),
        write: true,
    })
}

/// `path` with links resolved: itself when it exists, else its directory's resolved path
/// joined with its name (a file the run tried to create).
fn resolved(path: &Path) -> Option<PathBuf> {
    path.canonicalize().ok().or_else(|| {
        let parent = path.parent()?.canonicalize().ok()?;
        Some(parent.join(path.file_name()?))
    })
}

/// Whether this process's user may write `path` by its modes (or create it, by its directory's):
/// a refusal of such a path is the confinement's, not the file's.
fn owner_may_write(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    let meta =
        std::fs::metadata(path).or_else(|_| std::fs::metadata(path.parent().unwrap_or(path)));
    let Ok(meta) = meta else {
        return false;
    };
    let uid = nix::unistd::geteuid().as_raw();
    let gid = nix::unistd::getegid().as_raw();
    let mode = meta.mode();
    if meta.uid() == uid {
        mode & 0o200 != 0
    } else if meta.gid() == gid {
        mode & 0o020 != 0
    } else {
        mode & 0o002 != 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reach(tree: &Path) -> Reach {
        let tree = tree.canonicalize().expect("canonical");
        Reach {
            hidden: vec![tree.join(".consort")],
            writable: vec![tree.join("target")],
            tree,
            own_network: true,
            own_ptys: true,
        }
    }

    #[test]
    fn a_landlock_port_refusal_names_the_address() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = reach(dir.path());
        r.own_network = false;
        let node = "Error: connect EACCES 127.0.0.1:34113\n    at TCPConnectWrap";
        assert_eq!(
            read(node, &r),
            Some(Refusal::Connection {
                address: "127.0.0.1:34113".into()
            })
        );
        let go =
            "Get \"http://127.0.0.1:40000/\": dial tcp 127.0.0.1:40000: connect: permission denied";
        assert_eq!(
            read(go, &r),
            Some(Refusal::Connection {
                address: "127.0.0.1:40000".into()
            })
        );
        // With a network of its own, no port rule refuses a connection.
        r.own_network = true;
        assert_eq!(read(node, &r), None);
    }

    #[test]
    fn the_network_outside_is_named_and_a_refused_connection_is_not() {
        let dir = tempfile::tempdir().expect("tempdir");
        let r = reach(dir.path());
        assert_eq!(
            read(
                "Error: connect ENETUNREACH 93.184.216.34:443 - Local (0.0.0.0:0)",
                &r
            ),
            Some(Refusal::Network {
                address: "93.184.216.34:443".into()
            })
        );
        assert_eq!(
            read("getaddrinfo EAI_AGAIN registry.npmjs.org", &r),
            Some(Refusal::Network {
                address: "registry.npmjs.org".into()
            })
        );
        assert!(matches!(
            read(
                "socket.gaierror: [Errno -3] Temporary failure in name resolution",
                &r
            ),
            Some(Refusal::Network { .. })
        ));
        // Nothing listening is the test's own business, confined or not.
        assert_eq!(read("Error: connect ECONNREFUSED 127.0.0.1:5000", &r), None);
    }

    #[test]
    fn a_path_is_a_refusal_only_where_the_confinement_explains_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir_all(dir.path().join(".consort")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("target")).expect("mkdir");
        std::fs::create_dir_all(dir.path().join("tests")).expect("mkdir");
        std::fs::write(dir.path().join("tests/t.py"), "").expect("write");
        let r = reach(dir.path());
        let write = |p: &str| Refusal::Path {
            path: p.into(),
            write: true,
        };
        assert_eq!(
            read(
                "PermissionError: [Errno 13] Permission denied: 'tests/t.py'",
                &r
            ),
            Some(write("tests/t.py"))
        );
        assert_eq!(
            read(
                "Error: EACCES: permission denied, open 'tests/new.json'",
                &r
            ),
            Some(write("tests/new.json"))
        );
        let hidden = dir.path().join(".consort/ledger.jsonl");
        assert_eq!(
            read(&format!("cat: {}: Permission denied", hidden.display()), &r),
            Some(Refusal::Path {
                path: hidden.display().to_string(),
                write: false
            })
        );
        // Where the run may write, or what the file's own modes refuse, is no refusal of the
        // confinement; nor is a path named in a line that says nothing was refused.
        assert_eq!(
            read(
                "PermissionError: [Errno 13] Permission denied: 'target/x'",
                &r
            ),
            None
        );
        assert_eq!(read("cannot open 'tests/t.py': no such thing", &r), None);
        assert_eq!(read("HTTP 403: permission denied for user bob", &r), None);
    }

    #[test]
    fn no_pty_is_a_refusal_only_without_ptys_of_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut r = reach(dir.path());
        let line = "OSError: out of pty devices";
        assert_eq!(read(line, &r), None);
        r.own_ptys = false;
        assert_eq!(read(line, &r), Some(Refusal::Pty));
        let python = "    return os.openpty()\nPermissionError: [Errno 13] Permission denied";
        assert_eq!(read(python, &r), Some(Refusal::Pty));
    }
}
