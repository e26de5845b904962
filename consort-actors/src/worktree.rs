//! The project's work tree on disk: hashing it, reading it, and applying change sets safely.
//!
//! **Only the conductor writes the work tree**, through [`WorkTree::apply`], after the state
//! machine accepted the change set. Every path is confined to the tree: lexically (no absolute
//! paths, no `..`) and physically (no symlink on the way that leads outside). Before it writes,
//! the conductor resolves every path to the file it physically reaches
//! ([`WorkTree::resolve`]) and has the machine judge that file; [`WorkTree::apply`]
//! then checks what the file system will refuse before writing anything, and undoes what it
//! wrote if the OS refuses a path mid-way, so a change set is applied whole or not at all.
//!
//! Directories the [`TreeFilter`] skips (caches, version control, Consort's state, at any
//! depth) are never hashed, listed or read.
//!
//! Hashing is incremental: a handle (and every clone of it) keeps a stat cache (`cache.rs`),
//! so [`WorkTree::file_hashes`] reads only the files whose stat changed, or that changed too
//! recently for their stat to be trusted, and gives exactly what reading every file would.

mod cache;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::core::artifact::{ChangeSet, FileChange, FileHashes};
use crate::core::hash::ContentHash;
use crate::core::paths::{MAX_NAME_BYTES, PathError, TreeFilter, WriteProblem, normalise_relative};
use crate::core::protocol::{NotIncluded, Omission};

/// Most symbolic links followed while resolving one path (as the OS's `ELOOP` limit).
const MAX_LINK_HOPS: u32 = 40;

/// The name of the temporary file a write goes through, in the file's own directory.
const TMP_NAME: &str = ".consort-write.tmp";

/// A file-system failure in the work tree.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum WorkTreeError {
    /// A path was refused.
    #[error(transparent)]
    Path(#[from] PathError),
    /// The file system cannot take a change at a path; nothing of the change set was left
    /// applied. (The conductor turns this into a refusal the agent may retry.)
    #[error("{path} cannot be written: {problem}")]
    NotWritable {
        /// The path, relative to the work tree.
        path: String,
        /// What the file system objects to.
        problem: WriteProblem,
    },
    /// An I/O error on a path (relative when possible).
    #[error(transparent)]
    Io(#[from] PathIoError),
    /// A file is not UTF-8 text.
    #[error("{path} is not UTF-8 text")]
    NotText {
        /// The path.
        path: String,
    },
}

/// An operation on a path failed in the operating system: the machine's fault, never an
/// agent's. The work tree, the conductor and the command backend's scratch copy all say so
/// with it.
#[derive(Debug, thiserror::Error)]
#[error("{op} {path}")]
pub struct PathIoError {
    /// What was being done.
    pub op: &'static str,
    /// The path.
    pub path: String,
    /// The operating system's error.
    #[source]
    pub source: io::Error,
}

impl PathIoError {
    /// The failure of `op` on `path`.
    pub fn new(op: &'static str, path: impl std::fmt::Display, source: io::Error) -> PathIoError {
        let path = path.to_string();
        PathIoError { op, path, source }
    }

    /// For `map_err`: what turns the failure of `op` on `path` into a [`PathIoError`].
    pub fn at(op: &'static str, path: impl std::fmt::Display) -> impl FnOnce(io::Error) -> Self {
        let path = path.to_string();
        move |source| PathIoError { op, path, source }
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> WorkTreeError {
    let at = PathIoError::at(op, path.display());
    move |source| at(source).into()
}

fn not_writable(path: &str, problem: WriteProblem) -> WorkTreeError {
    WorkTreeError::NotWritable {
        path: path.to_string(),
        problem,
    }
}

/// Sorts an OS error on `rel` into "the path's fault" (a typed [`WorkTreeError::NotWritable`]
/// the agent may retry) or "the machine's" (an [`WorkTreeError::Io`] that stops the run: a full
/// disk, a read-only file system, a failing device).
fn classify(op: &'static str, rel: &str, source: io::Error) -> WorkTreeError {
    use io::ErrorKind as K;
    let problem = match source.kind() {
        K::NotADirectory | K::AlreadyExists => WriteProblem::NotADirectory {
            path: rel.to_string(),
        },
        K::IsADirectory | K::DirectoryNotEmpty => WriteProblem::IsADirectory {
            path: rel.to_string(),
        },
        K::InvalidFilename
        | K::InvalidInput
        | K::PermissionDenied
        | K::NotFound
        | K::CrossesDevices => WriteProblem::Refused {
            op: op.to_string(),
            detail: source.to_string(),
        },
        _ => return PathIoError::new(op, rel, source).into(),
    };
    not_writable(rel, problem)
}

/// Refuses a path with a component the file system would find too long.
fn check_names(rel: &str) -> Result<(), WorkTreeError> {
    match rel.split('/').map(str::len).find(|l| *l > MAX_NAME_BYTES) {
        Some(len) => Err(not_writable(
            rel,
            WriteProblem::NameTooLong {
                len,
                max: MAX_NAME_BYTES,
            },
        )),
        None => Ok(()),
    }
}

/// One change, checked and with the bytes its file holds now (`None`: no file), ready to write.
struct Planned<'a> {
    /// What the change leaves at the path (None: nothing, a deletion).
    bytes: Option<std::borrow::Cow<'a, [u8]>>,
    norm: String,
    full: PathBuf,
    before: Option<Vec<u8>>,
}

/// A handle on the work tree directory.
///
/// Clones share one hash cache: a holder that hashes the tree again and again (the conductor
/// at every build step, the verifier before and after every run) keeps one handle and reads
/// only what changed.
#[derive(Debug, Clone)]
pub struct WorkTree {
    root: PathBuf,
    filter: TreeFilter,
    cache: Arc<Mutex<cache::HashCache>>,
}

impl WorkTree {
    /// A work tree rooted at `root` (created if missing), skipping the default directories.
    pub fn open(root: impl Into<PathBuf>) -> Result<Self, WorkTreeError> {
        let root = root.into();
        fs::create_dir_all(&root).map_err(io_err("create", &root))?;
        let root = root.canonicalize().map_err(io_err("resolve", &root))?;
        Ok(WorkTree {
            root,
            filter: TreeFilter::default(),
            cache: Arc::default(),
        })
    }

    /// The same handle (its hash cache shared), skipping the directories of `filter` (the
    /// project's caches). What is hashed is decided by the walk alone, so a cache filled under
    /// another filter gives the same answers.
    pub fn with_filter(mut self, filter: TreeFilter) -> Self {
        self.filter = filter;
        self
    }

    /// The directories never hashed, listed or read.
    pub fn filter(&self) -> &TreeFilter {
        &self.filter
    }

    /// The canonical root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Confines a relative path to the tree for this handle's own reads and writes: lexically,
    /// and no symbolic link on the way may lead outside. It does not say which file the path
    /// reaches, so it is private: whoever judges a path asks [`WorkTree::resolve`].
    fn confine(&self, rel: &str) -> Result<(String, PathBuf), WorkTreeError> {
        let norm = normalise_relative(rel)?;
        check_names(&norm)?;
        let full = self.root.join(&norm);
        // Walk every existing ancestor: a symlink on the way must stay inside the tree.
        let mut cur = self.root.clone();
        for comp in norm.split('/') {
            cur.push(comp);
            match fs::symlink_metadata(&cur) {
                Ok(meta) if meta.file_type().is_symlink() => {
                    let target = cur.canonicalize().ok();
                    match target {
                        Some(t) if t.starts_with(&self.root) => {}
                        _ => return Err(PathError::EscapesThroughLink { path: norm }.into()),
                    }
                }
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::NotFound => break,
                Err(e) => return Err(classify("inspect", &norm, e)),
            }
        }
        Ok((norm, full))
    }

    /// The path `rel` physically reaches, relative to the tree: every existing symbolic link on
    /// the way (the last component included, dangling links too) is followed as the OS would,
    /// and the part that does not exist yet is kept as spelled. This is the file a write or a
    /// delete of `rel` touches, and so the path the rules judge.
    ///
    /// Refused: a resolution that leaves the tree ([`PathError::EscapesThroughLink`]), a file
    /// where a directory must be, a component too long, a link loop
    /// ([`WorkTreeError::NotWritable`]).
    pub fn resolve(&self, rel: &str) -> Result<String, WorkTreeError> {
        let norm = normalise_relative(rel)?;
        check_names(&norm)?;
        let escape = || WorkTreeError::Path(PathError::EscapesThroughLink { path: norm.clone() });
        let full = match physical(&self.root, &norm) {
            Ok(full) => full,
            Err(Physical::NotADirectory(file)) => {
                let path = file
                    .strip_prefix(&self.root)
                    .map(|p| p.to_string_lossy().into_owned())
                    .map_err(|_| escape())?;
                return Err(not_writable(&norm, WriteProblem::NotADirectory { path }));
            }
            Err(Physical::Loop) => {
                let problem = WriteProblem::Refused {
                    op: "resolve".into(),
                    detail: format!("more than {MAX_LINK_HOPS} symbolic links on the way"),
                };
                return Err(not_writable(&norm, problem));
            }
            Err(Physical::Io(e)) => return Err(classify("resolve", &norm, e)),
        };
        let inside = full.strip_prefix(&self.root).map_err(|_| escape())?;
        let mut parts = Vec::new();
        for comp in inside.components() {
            match comp {
                Component::Normal(name) => parts.push(name.to_string_lossy().into_owned()),
                _ => return Err(escape()),
            }
        }
        if parts.is_empty() {
            let problem = WriteProblem::IsADirectory { path: ".".into() };
            return Err(not_writable(&norm, problem));
        }
        Ok(normalise_relative(&parts.join("/"))?)
    }

    /// The change set with every path replaced by the path it physically reaches
    /// ([`WorkTree::resolve`]), and the paths that changed (spelled → resolved).
    pub fn resolve_set(
        &self,
        set: &ChangeSet,
    ) -> Result<(ChangeSet, BTreeMap<String, String>), WorkTreeError> {
        let mut changes = Vec::with_capacity(set.changes.len());
        let mut moved = BTreeMap::new();
        for change in &set.changes {
            let path = self.resolve(change.path())?;
            if path != change.path() {
                moved.insert(change.path().to_string(), path.clone());
            }
            changes.push(change.at(path));
        }
        let set = ChangeSet {
            summary: set.summary.clone(),
            changes,
        };
        Ok((set, moved))
    }

    /// Reads a text file, or `None` when it does not exist.
    pub fn read(&self, rel: &str) -> Result<Option<String>, WorkTreeError> {
        let (norm, full) = self.confine(rel)?;
        match fs::read(&full) {
            Ok(bytes) => String::from_utf8(bytes)
                .map(Some)
                .map_err(|_| WorkTreeError::NotText { path: norm }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err("read", &full)(e)),
        }
    }

    /// Checks every change of `set` without writing anything: the path is confined, its names
    /// fit the file system, no file stands where a directory must be, no directory where the
    /// file is; and reads what each file holds now.
    fn plan<'a>(&self, set: &'a ChangeSet) -> Result<Vec<Planned<'a>>, WorkTreeError> {
        let mut plan = Vec::with_capacity(set.changes.len());
        for change in &set.changes {
            let (norm, full) = self.confine(change.path())?;
            let before = match fs::read(&full) {
                Ok(bytes) => Some(bytes),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(classify("read", &norm, e)),
            };
            let bytes = match change {
                FileChange::Restore { .. } => Some(change.bytes().ok_or_else(|| {
                    not_writable(&norm, WriteProblem::MalformedRestore { path: norm.clone() })
                })?),
                _ => change.bytes(),
            };
            plan.push(Planned {
                bytes,
                norm,
                full,
                before,
            });
        }
        Ok(plan)
    }

    /// The change set that restores every file `set` touches as it is now (the first time a
    /// path appears counts), computed without writing anything and after the same checks as
    /// [`WorkTree::apply`]. Bytes-safe: a file that is not UTF-8 text is put back byte for byte
    /// ([`FileChange::Restore`]).
    pub fn undo(&self, set: &ChangeSet) -> Result<ChangeSet, WorkTreeError> {
        let mut changes = Vec::with_capacity(set.changes.len());
        let mut seen = std::collections::BTreeSet::new();
        for p in self.plan(set)? {
            if !seen.insert(p.norm.clone()) {
                continue;
            }
            changes.push(match p.before {
                Some(bytes) => FileChange::exactly(p.norm, bytes),
                None => FileChange::Delete { path: p.norm },
            });
        }
        Ok(ChangeSet {
            summary: format!("undo: {}", set.summary),
            changes,
        })
    }

    /// Applies a change set and returns its inverse (the change set that restores the files as
    /// they were). Every path is checked before any file is written; if the file system refuses
    /// a write mid-way, what was written (files and new directories) is undone before the error
    /// is returned, so nothing of a failed change set stays applied.
    pub fn apply(&self, set: &ChangeSet) -> Result<ChangeSet, WorkTreeError> {
        let plan = self.plan(set)?;
        let mut done: Vec<&Planned<'_>> = Vec::with_capacity(plan.len());
        let mut created: Vec<PathBuf> = Vec::new();
        for p in &plan {
            if let Err(e) = self.write_one(p, &mut created) {
                self.roll_back(&done, &created)?;
                return Err(e);
            }
            done.push(p);
        }
        let mut inverse: Vec<FileChange> = plan
            .into_iter()
            .map(|p| match p.before {
                Some(bytes) => FileChange::exactly(p.norm, bytes),
                None => FileChange::Delete { path: p.norm },
            })
            .collect();
        inverse.reverse();
        Ok(ChangeSet {
            summary: format!("undo: {}", set.summary),
            changes: inverse,
        })
    }

    fn write_one(&self, p: &Planned<'_>, created: &mut Vec<PathBuf>) -> Result<(), WorkTreeError> {
        match &p.bytes {
            Some(bytes) => {
                if let Some(parent) = p.full.parent() {
                    self.create_dirs(parent, &p.norm, created)?;
                }
                write_atomic(&p.full, bytes).map_err(|(op, e)| classify(op, &p.norm, e))
            }
            None => match fs::remove_file(&p.full) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(classify("delete", &p.norm, e)),
            },
        }
    }

    /// Creates `dir` and its missing ancestors inside the tree, recording each one created.
    fn create_dirs(
        &self,
        dir: &Path,
        rel: &str,
        created: &mut Vec<PathBuf>,
    ) -> Result<(), WorkTreeError> {
        let missing: Vec<&Path> = dir
            .ancestors()
            .take_while(|a| *a != self.root && fs::symlink_metadata(a).is_err())
            .collect();
        for d in missing.into_iter().rev() {
            fs::create_dir(d).map_err(|e| classify("create directory", rel, e))?;
            created.push(d.to_path_buf());
        }
        Ok(())
    }

    /// Restores the files of `done` as they were (last first) and removes the directories
    /// created for them. A failure here is an I/O error: the tree could not be put back.
    fn roll_back(&self, done: &[&Planned<'_>], created: &[PathBuf]) -> Result<(), WorkTreeError> {
        for p in done.iter().rev() {
            match &p.before {
                Some(bytes) => {
                    write_atomic(&p.full, bytes).map_err(|(_, e)| io_err("restore", &p.full)(e))?
                }
                None => match fs::remove_file(&p.full) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err("restore", &p.full)(e)),
                },
            }
        }
        // Best effort: an empty directory left behind holds no file, so no hash sees it.
        for d in created.iter().rev() {
            let _ = fs::remove_dir(d);
        }
        Ok(())
    }

    /// Hashes every file of the tree (outside the directories the [`TreeFilter`] skips):
    /// relative path → content hash.
    ///
    /// Exactly what reading every file gives, but a file is read only when its stat differs
    /// from the one its cached hash was taken under, or when that stat was too recent to be
    /// trusted (see `worktree/cache.rs`); the cache is shared by this handle's clones.
    pub fn file_hashes(&self) -> Result<FileHashes, WorkTreeError> {
        let found = self.lock_cache().pass(&self.root, &self.filter)?;
        Ok(into_map(found))
    }

    /// The hash cache; one poisoned by a panic mid-pass is emptied, not trusted.
    fn lock_cache(&self) -> MutexGuard<'_, cache::HashCache> {
        self.cache.lock().unwrap_or_else(|poisoned| {
            let mut cache = poisoned.into_inner();
            cache.clear();
            self.cache.clear_poison();
            cache
        })
    }

    /// Every file of the tree (outside the directories the [`TreeFilter`] skips), as sorted
    /// relative paths, without reading them.
    pub fn files(&self) -> Result<Vec<String>, WorkTreeError> {
        let mut out = Vec::new();
        walk(&self.root, "", &self.filter, &mut |rel, _, _| {
            out.push(rel.to_string());
            Ok(())
        })?;
        out.sort();
        Ok(out)
    }

    /// Copies every file of the tree (what [`WorkTree::files`] lists, permissions kept) into
    /// `dest`, an empty directory; returns the copy, skipping the same directories. The copy
    /// hashes as the tree does.
    pub fn copy_into(&self, dest: &Path) -> Result<WorkTree, WorkTreeError> {
        walk(&self.root, "", &self.filter, &mut |rel, full, _| {
            let to = dest.join(rel);
            if let Some(parent) = to.parent() {
                fs::create_dir_all(parent).map_err(io_err("create", parent))?;
            }
            fs::copy(full, &to).map_err(io_err("copy", full))?;
            Ok(())
        })?;
        Ok(WorkTree::open(dest)?.with_filter(self.filter.clone()))
    }

    /// One hash for the whole tree: the canonical hash of [`WorkTree::file_hashes`]. A caller
    /// that needs the file hashes too takes them once and hashes them with [`ContentHash::of`].
    pub fn hash(&self) -> Result<ContentHash, WorkTreeError> {
        Ok(ContentHash::of(&self.file_hashes()?))
    }

    /// Reads every text file whose relative path satisfies `keep`, up to `max_bytes` in total.
    pub fn read_matching(
        &self,
        keep: impl Fn(&str) -> bool,
        max_bytes: usize,
    ) -> Result<BTreeMap<String, String>, WorkTreeError> {
        let mut out = BTreeMap::new();
        let mut total = 0usize;
        walk(&self.root, "", &self.filter, &mut |rel, full, _| {
            if !keep(rel) || total >= max_bytes {
                return Ok(());
            }
            let bytes = fs::read(full).map_err(io_err("read", full))?;
            if let Ok(text) = String::from_utf8(bytes) {
                total += text.len();
                out.insert(rel.to_string(), text);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The files a step gets: every file `listed` accepts is either read in full (when
    /// `include` accepts it, it is UTF-8 text and the total stays within `max_bytes`) or named
    /// in the second list with its size and the reason it was left out.
    pub fn read_scoped(
        &self,
        listed: impl Fn(&str) -> bool,
        include: impl Fn(&str) -> bool,
        max_bytes: usize,
    ) -> Result<(BTreeMap<String, String>, Vec<NotIncluded>), WorkTreeError> {
        let mut files = BTreeMap::new();
        let mut left_out = Vec::new();
        let mut total = 0usize;
        walk(&self.root, "", &self.filter, &mut |rel, full, _| {
            if !listed(rel) {
                return Ok(());
            }
            let bytes = fs::metadata(full).map_err(io_err("inspect", full))?.len();
            let size = usize::try_from(bytes).unwrap_or(usize::MAX);
            let why = if !include(rel) {
                Omission::NotInPack
            } else if total.saturating_add(size) > max_bytes {
                Omission::OverLimit
            } else {
                match String::from_utf8(fs::read(full).map_err(io_err("read", full))?) {
                    Ok(text) => {
                        total += text.len();
                        files.insert(rel.to_string(), text);
                        return Ok(());
                    }
                    Err(_) => Omission::NotText,
                }
            };
            left_out.push(NotIncluded {
                path: rel.to_string(),
                bytes,
                why,
            });
            Ok(())
        })?;
        Ok((files, left_out))
    }
}

impl WorkTree {
    /// The cache directories that exist in the tree, at any depth (not inside another skipped
    /// directory): a confined test run may write there. Version control and Consort's state
    /// are skipped too, but never listed here; of a dependency directory
    /// ([`crate::DEPENDENCY_DIRS`]) only the tools' caches inside it are listed, made here
    /// when missing (one that cannot be made is left out: the run may not write it).
    pub fn cache_dirs(&self) -> Result<Vec<PathBuf>, WorkTreeError> {
        fn find(
            dir: &Path,
            filter: &TreeFilter,
            out: &mut Vec<PathBuf>,
        ) -> Result<(), WorkTreeError> {
            for entry in fs::read_dir(dir)
                .map_err(io_err("list", dir))?
                .filter_map(Result::ok)
            {
                let path = entry.path();
                if !entry
                    .file_type()
                    .map_err(io_err("inspect", &path))?
                    .is_dir()
                {
                    continue;
                }
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if let Some(caches) = crate::dependency_caches(&name) {
                    // A real directory only: a link there would open where it leads.
                    out.extend(caches.iter().map(|c| path.join(c)).filter(|c| {
                        fs::symlink_metadata(c).is_ok_and(|m| m.is_dir())
                            || fs::create_dir(c).is_ok()
                    }));
                } else if filter.is_cache(&name) {
                    out.push(path);
                } else if !filter.skips(&name) {
                    find(&path, filter, out)?;
                }
            }
            Ok(())
        }
        let mut out = Vec::new();
        find(&self.root, &self.filter, &mut out)?;
        out.sort();
        Ok(out)
    }
}

/// Hashes a work tree directory without opening a [`WorkTree`] handle, skipping the default
/// directories of [`TreeFilter`].
pub fn hash_dir(root: &Path) -> Result<ContentHash, WorkTreeError> {
    WorkTree::open(root)?.hash()
}

/// Why a path could not be resolved physically.
enum Physical {
    /// This existing file stands where a directory must be.
    NotADirectory(PathBuf),
    /// Too many symbolic links on the way (a loop).
    Loop,
    /// Another failure (a link loop, a name the OS refuses, …).
    Io(io::Error),
}

/// Resolves `rel` under `root` as the OS would when opening it: component by component, every
/// existing symbolic link followed (its target resolved from the link's directory, or from `/`
/// when absolute), `..` taken from the resolved parent; once a component does not exist, the
/// rest is appended as spelled (a missing directory will be created as a real one).
fn physical(root: &Path, rel: &str) -> Result<PathBuf, Physical> {
    let mut todo: Vec<OsString> = rel.split('/').rev().map(OsString::from).collect();
    let mut cur = root.to_path_buf();
    let mut missing = false;
    let mut hops = 0u32;
    while let Some(comp) = todo.pop() {
        if comp.is_empty() || comp == "." {
            continue;
        }
        if comp == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&comp);
        if missing {
            cur = next;
            continue;
        }
        match fs::symlink_metadata(&next) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                missing = true;
                cur = next;
            }
            Err(e) if e.kind() == io::ErrorKind::NotADirectory => {
                return Err(Physical::NotADirectory(cur));
            }
            Err(e) => return Err(Physical::Io(e)),
            Ok(meta) if meta.file_type().is_symlink() => {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(Physical::Loop);
                }
                let target = fs::read_link(&next).map_err(Physical::Io)?;
                if target.is_absolute() {
                    cur = PathBuf::from("/");
                }
                let parts: Vec<OsString> = target
                    .components()
                    .filter_map(|c| match c {
                        Component::Normal(n) => Some(n.to_os_string()),
                        Component::ParentDir => Some(OsString::from("..")),
                        _ => None,
                    })
                    .collect();
                todo.extend(parts.into_iter().rev());
            }
            Ok(meta) => {
                let more = todo.iter().any(|c| !c.is_empty() && c != ".");
                if more && !meta.is_dir() {
                    return Err(Physical::NotADirectory(next));
                }
                cur = next;
            }
        }
    }
    Ok(cur)
}

/// One entry of a directory as a walk sees it.
enum Listed {
    /// A regular file: its path relative to the tree, and its directory entry.
    File(String, fs::DirEntry),
    /// A directory to walk: its full path, and its path relative to the tree ending in `/`.
    Dir(PathBuf, String),
}

/// The entries of `dir` (whose path relative to the tree is `prefix`, empty or ending in `/`)
/// a walk visits, in the order of their names: regular files, and directories `filter` does
/// not skip. A relative path is `/`-separated, a name that is not UTF-8 written lossily, a `\\`
/// written `/`. The one definition of what a walk sees, serial ([`walk`]) or not (the hash
/// cache's pass).
fn list_dir(dir: &Path, prefix: &str, filter: &TreeFilter) -> Result<Vec<Listed>, WorkTreeError> {
    let mut entries: Vec<(OsString, fs::DirEntry)> = fs::read_dir(dir)
        .map_err(io_err("list", dir))?
        .filter_map(Result::ok)
        .map(|e| (e.file_name(), e))
        .collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    let mut out = Vec::with_capacity(entries.len());
    for (name, entry) in entries {
        let ft = entry
            .file_type()
            .map_err(|e| io_err("inspect", &entry.path())(e))?;
        // Symlinks are not followed and not hashed: agents cannot create them, and a link
        // planted by someone else never makes the conductor read outside the tree.
        if !ft.is_dir() && !ft.is_file() {
            continue;
        }
        let name = name.to_string_lossy();
        // Caches, version control and Consort's state, at any depth; and version control's
        // pointer files (a git worktree's or submodule's `.git`, which names where this
        // machine keeps the repository: the same tree hashes alike on every machine).
        if (ft.is_dir() && filter.skips(&name))
            || (ft.is_file() && crate::core::paths::VCS_DIRS.contains(&name.as_ref()))
        {
            continue;
        }
        let mut rel = String::with_capacity(prefix.len() + name.len() + 1);
        rel.push_str(prefix);
        if name.contains('\\') {
            rel.push_str(&name.replace('\\', "/"));
        } else {
            rel.push_str(&name);
        }
        if ft.is_dir() {
            rel.push('/');
            out.push(Listed::Dir(entry.path(), rel));
        } else {
            out.push(Listed::File(rel, entry));
        }
    }
    Ok(out)
}

/// Visits every regular file under `dir` (relative path `prefix`) as [`list_dir`] lists them,
/// depth first, in the order of the names in each directory. The visitor gets the file's
/// relative path, its full path and its directory entry.
fn walk(
    dir: &Path,
    prefix: &str,
    filter: &TreeFilter,
    visit: &mut dyn FnMut(&str, &Path, &fs::DirEntry) -> Result<(), WorkTreeError>,
) -> Result<(), WorkTreeError> {
    for item in list_dir(dir, prefix, filter)? {
        match item {
            Listed::Dir(path, rel) => walk(&path, &rel, filter, visit)?,
            Listed::File(rel, entry) => visit(&rel, &entry.path(), &entry)?,
        }
    }
    Ok(())
}

/// The map of what a pass found, built at once (sorted, then bulk-built): what inserting the
/// files one by one in the walk's order gives. Two names that are not UTF-8 may read alike;
/// then the last in the walk's order wins, as an insert would have it: the walk visits files
/// in the component-wise order of their full paths, which breaks the tie.
fn into_map(mut found: Vec<cache::Found>) -> FileHashes {
    found.sort_unstable_by(|a, b| a.rel.cmp(&b.rel).then_with(|| a.full.cmp(&b.full)));
    let mut unique: Vec<(String, ContentHash)> = Vec::with_capacity(found.len());
    for f in found {
        match unique.last_mut() {
            Some(last) if last.0 == f.rel => last.1 = f.hash,
            _ => unique.push((f.rel, f.hash)),
        }
    }
    unique.into_iter().collect()
}

/// Writes through a temporary file in the same directory and renames it into place, so a file
/// is never seen half-written. The temporary name is short, so a name that fits fits with it.
fn write_atomic(full: &Path, bytes: &[u8]) -> Result<(), (&'static str, io::Error)> {
    let tmp = full.with_file_name(TMP_NAME);
    fs::write(&tmp, bytes).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ("write", e)
    })?;
    fs::rename(&tmp, full).map_err(|e| {
        let _ = fs::remove_file(&tmp);
        ("write", e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A work tree in a fresh directory, holding these files.
    fn tree_with(files: &[(&str, &str)]) -> (tempfile::TempDir, WorkTree) {
        let dir = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        for (path, content) in files {
            let file = dir.path().join(path);
            fs::create_dir_all(file.parent().expect("parent")).expect("mkdir");
            fs::write(file, content).expect("seed");
        }
        (dir, wt)
    }

    fn write(path: &str, content: &str) -> FileChange {
        FileChange::Write {
            path: path.into(),
            content: content.into(),
        }
    }

    #[test]
    fn a_git_worktrees_pointer_file_is_not_hashed_so_clones_on_two_machines_hash_alike() {
        let (_a, here) = tree_with(&[
            ("src/a.sql", "a"),
            (".git", "gitdir: /home/ada/shop/.git/worktrees/f1"),
        ]);
        let (_b, there) = tree_with(&[
            ("src/a.sql", "a"),
            (".git", "gitdir: /work/m3/shop/.git/worktrees/f1"),
        ]);
        assert_eq!(here.hash().expect("hash"), there.hash().expect("hash"));
        assert_eq!(here.files().expect("files"), ["src/a.sql"]);
        // What the tree holds still counts.
        std::fs::write(there.root().join("src/a.sql"), "b").expect("write");
        assert_ne!(here.hash().expect("hash"), there.hash().expect("hash"));
    }

    #[test]
    fn apply_then_inverse_restores_the_tree() {
        let (_dir, wt) = tree_with(&[("keep.sql", "old")]);
        let before = wt.hash().expect("hash");
        let set = ChangeSet {
            summary: "s".into(),
            changes: vec![
                write("keep.sql", "new"),
                write("src/a.sql", "a"),
                FileChange::Delete {
                    path: "nope".into(),
                },
            ],
        };
        let inverse = wt.apply(&set).expect("apply");
        assert_eq!(wt.read("keep.sql").expect("read").as_deref(), Some("new"));
        assert_ne!(wt.hash().expect("hash"), before);
        wt.apply(&inverse).expect("undo");
        assert_eq!(wt.read("keep.sql").expect("read").as_deref(), Some("old"));
        assert_eq!(wt.read("src/a.sql").expect("read"), None);
        assert_eq!(wt.hash().expect("hash"), before);
    }

    #[test]
    fn escapes_are_refused_before_anything_is_written() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        std::os::unix::fs::symlink(outside.path(), dir.path().join("link")).expect("symlink");
        for bad in ["../x", "/tmp/x", "link/evil.sql"] {
            let set = ChangeSet {
                summary: String::new(),
                changes: vec![write("ok.sql", "1"), write(bad, "x")],
            };
            assert!(wt.apply(&set).is_err(), "{bad} must be refused");
            assert_eq!(
                wt.read("ok.sql").expect("read"),
                None,
                "nothing applied for {bad}"
            );
        }
        assert!(fs::read_dir(outside.path()).expect("list").next().is_none());
    }

    /// [`tree_with`] `files`, and `links` (target, where) in it.
    fn tree_with_links(
        files: &[(&str, &str)],
        links: &[(&str, &str)],
    ) -> (tempfile::TempDir, WorkTree) {
        let (dir, wt) = tree_with(files);
        for (target, at) in links {
            link(target, &dir.path().join(at));
        }
        (dir, wt)
    }

    fn link(target: &str, at: &Path) {
        if let Some(parent) = at.parent() {
            fs::create_dir_all(parent).expect("mkdir");
        }
        std::os::unix::fs::symlink(target, at).expect("symlink");
    }

    #[test]
    fn a_path_resolves_to_the_file_it_physically_reaches() {
        let (_dir, wt) = tree_with_links(
            &[("tests/t1.sql", "t1"), ("consort.toml", "")],
            &[
                ("../tests", "src/link"),
                ("../consort.toml", "src/cfg"),
                ("..", "src/up"),
                ("../tests/t9.sql", "src/dangling.sql"),
            ],
        );
        let root = wt.root().to_path_buf();
        link(&root.join("tests").display().to_string(), &root.join("abs"));
        for (spelled, reached) in [
            ("src/link/t1.sql", "tests/t1.sql"),
            ("src/link/new/t2.sql", "tests/new/t2.sql"),
            ("src/cfg", "consort.toml"),
            ("src/up/consort.toml", "consort.toml"),
            ("src/up/src/up/.git/config", ".git/config"),
            ("src/dangling.sql", "tests/t9.sql"),
            ("abs/t1.sql", "tests/t1.sql"),
            ("src/plain/a.sql", "src/plain/a.sql"),
            ("./src//a.sql", "src/a.sql"),
        ] {
            assert_eq!(wt.resolve(spelled).expect(spelled), reached, "{spelled}");
        }
        let set = ChangeSet {
            summary: "s".into(),
            changes: vec![
                write("src/a.sql", "a"),
                FileChange::Delete {
                    path: "src/link/t1.sql".into(),
                },
            ],
        };
        let (resolved, moved) = wt.resolve_set(&set).expect("resolve");
        assert_eq!(resolved.changes[1].path(), "tests/t1.sql");
        assert_eq!(
            moved.into_iter().collect::<Vec<_>>(),
            vec![("src/link/t1.sql".to_string(), "tests/t1.sql".to_string())]
        );
    }

    /// The link tricks a review found against the lexical resolver this module used to export:
    /// a link inside the tree onto a frozen test, and a link onto the root that spells
    /// Consort's own files under another directory. Every public resolver must name the file
    /// reached, never the spelling.
    #[test]
    fn every_public_resolver_names_the_file_a_link_trick_reaches() {
        let (_dir, wt) = tree_with_links(
            &[("tests/t1_add_item.sql", "frozen"), ("consort.toml", "")],
            &[("../tests", "src/fixtures"), (".", "conf")],
        );
        let tricks = [
            ("src/fixtures/t1_add_item.sql", "tests/t1_add_item.sql"),
            ("conf/consort.toml", "consort.toml"),
            ("conf/.consort/x", ".consort/x"),
        ];
        for (spelled, reached) in tricks {
            assert_eq!(wt.resolve(spelled).expect(spelled), reached, "resolve");
        }
        let set = ChangeSet {
            summary: "tricks".into(),
            changes: tricks.iter().map(|(s, _)| write(s, "x")).collect(),
        };
        let (resolved, moved) = wt.resolve_set(&set).expect("resolve_set");
        let paths: Vec<&str> = resolved.changes.iter().map(FileChange::path).collect();
        let reached: Vec<&str> = tricks.iter().map(|(_, r)| *r).collect();
        assert_eq!(paths, reached, "resolve_set");
        assert_eq!(
            moved.len(),
            tricks.len(),
            "every spelling is reported as moved"
        );
    }

    #[test]
    fn physical_resolution_refuses_what_cannot_be_reached() {
        let dir = tempfile::tempdir().expect("tempdir");
        let outside = tempfile::tempdir().expect("tempdir");
        let wt = WorkTree::open(dir.path()).expect("open");
        let root = wt.root().to_path_buf();
        fs::create_dir_all(root.join("src")).expect("mkdir");
        fs::write(root.join("src/file.sql"), "x").expect("seed");
        link(&outside.path().display().to_string(), &root.join("out"));
        link("../../x", &root.join("src/climb"));
        link("loop2", &root.join("loop1"));
        link("loop1", &root.join("loop2"));
        link(".", &root.join("here"));
        assert!(matches!(
            wt.resolve("out/evil.sql"),
            Err(WorkTreeError::Path(PathError::EscapesThroughLink { .. }))
        ));
        assert!(matches!(
            wt.resolve("src/climb"),
            Err(WorkTreeError::Path(PathError::EscapesThroughLink { .. }))
        ));
        match wt.resolve("src/file.sql/x.sql") {
            Err(WorkTreeError::NotWritable {
                problem: WriteProblem::NotADirectory { path },
                ..
            }) => assert_eq!(path, "src/file.sql"),
            other => panic!("expected not-a-directory, got {other:?}"),
        }
        let long = format!("src/{}/a.sql", "n".repeat(300));
        assert!(matches!(
            wt.resolve(&long),
            Err(WorkTreeError::NotWritable {
                problem: WriteProblem::NameTooLong { len: 300, max: 255 },
                ..
            })
        ));
        assert!(matches!(
            wt.resolve("loop1/a"),
            Err(WorkTreeError::NotWritable {
                problem: WriteProblem::Refused { .. },
                ..
            })
        ));
        assert!(matches!(
            wt.resolve("here"),
            Err(WorkTreeError::NotWritable {
                problem: WriteProblem::IsADirectory { .. },
                ..
            })
        ));
    }

    #[test]
    fn what_the_file_system_refuses_is_found_before_anything_is_written() {
        let (dir, wt) = tree_with(&[]);
        fs::create_dir_all(dir.path().join("src/dir")).expect("mkdir");
        fs::write(dir.path().join("src/file.sql"), "file").expect("seed");
        let before = wt.hash().expect("hash");
        let long = format!("src/{}.sql", "n".repeat(300));
        for (bad, expected) in [
            (write(&long, "x"), "name too long"),
            (write("src/file.sql/x.sql", "x"), "not a directory"),
            (write("src/dir", "x"), "is a directory"),
            (
                FileChange::Delete {
                    path: "src/dir".into(),
                },
                "is a directory",
            ),
        ] {
            let set = ChangeSet {
                summary: String::new(),
                changes: vec![write("src/ok.sql", "1"), bad],
            };
            let err = wt.apply(&set).expect_err(expected);
            let problem = match &err {
                WorkTreeError::NotWritable { problem, .. } => problem.clone(),
                other => panic!("{expected}: {other:?}"),
            };
            let got = match problem {
                WriteProblem::NameTooLong { .. } => "name too long",
                WriteProblem::NotADirectory { .. } => "not a directory",
                WriteProblem::IsADirectory { .. } => "is a directory",
                other => panic!("{expected}: {other:?}"),
            };
            assert_eq!(got, expected);
            assert!(
                wt.undo(&set).is_err(),
                "{expected}: the undo is refused too"
            );
            assert_eq!(
                wt.hash().expect("hash"),
                before,
                "{expected}: nothing written"
            );
            assert!(!dir.path().join("src/ok.sql").exists());
        }
    }

    #[test]
    fn a_write_refused_mid_way_is_undone_files_and_directories() {
        let (dir, wt) = tree_with(&[("keep.sql", "old")]);
        let before = wt.hash().expect("hash");
        // Each change is fine on the tree as it is; the later ones collide with the earlier.
        for changes in [
            vec![
                write("keep.sql", "new"),
                write("src/new/deep/a.sql", "a"),
                write("src/new", "a file where a directory now is"),
            ],
            vec![
                write("keep.sql", "new"),
                write("lib/a.sql", "a"),
                write("lib/a.sql/b.sql", "under a file just written"),
            ],
        ] {
            let set = ChangeSet {
                summary: String::new(),
                changes,
            };
            let err = wt.apply(&set).expect_err("refused mid-way");
            assert!(
                matches!(err, WorkTreeError::NotWritable { .. }),
                "the path's fault, not the machine's: {err:?}"
            );
            assert_eq!(wt.read("keep.sql").expect("read").as_deref(), Some("old"));
            assert!(
                !dir.path().join("src").exists(),
                "created directories removed"
            );
            assert!(!dir.path().join("lib").exists());
            assert_eq!(wt.hash().expect("hash"), before);
            let names: Vec<_> = fs::read_dir(dir.path())
                .expect("list")
                .map(|e| e.expect("entry").file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("keep.sql")]);
        }
    }

    #[test]
    fn a_file_that_is_not_text_is_undone_byte_for_byte() {
        let (dir, wt) = tree_with(&[]);
        let blob = [0xff, 0xfe, 0x00, b'x', 0x80];
        fs::write(dir.path().join("blob.bin"), blob).expect("seed");
        fs::write(dir.path().join("gone.bin"), [0xc3, 0x28]).expect("seed");
        let before = wt.hash().expect("hash");
        let set = ChangeSet {
            summary: String::new(),
            changes: vec![
                write("blob.bin", "text"),
                FileChange::Delete {
                    path: "gone.bin".into(),
                },
            ],
        };
        let undo = wt
            .undo(&set)
            .expect("an undo, computed before anything is written");
        let inverse = wt.apply(&set).expect("applied");
        assert_eq!(
            fs::read(dir.path().join("blob.bin")).expect("read"),
            b"text"
        );
        assert!(!dir.path().join("gone.bin").exists());
        // The undo and the inverse agree, and neither loses a byte.
        let mut reversed = inverse.changes.clone();
        reversed.reverse();
        assert_eq!(undo.changes, reversed);
        assert!(
            undo.changes
                .iter()
                .all(|c| matches!(c, FileChange::Restore { .. })),
            "{undo:?}"
        );
        wt.apply(&inverse).expect("undone");
        assert_eq!(fs::read(dir.path().join("blob.bin")).expect("read"), blob);
        assert_eq!(
            fs::read(dir.path().join("gone.bin")).expect("read"),
            [0xc3, 0x28]
        );
        assert_eq!(wt.hash().expect("hash"), before);
        // A restore whose hex does not decode is refused before anything is written.
        let bad = ChangeSet {
            summary: String::new(),
            changes: vec![FileChange::Restore {
                path: "blob.bin".into(),
                hex: "zz".into(),
            }],
        };
        assert!(matches!(
            wt.apply(&bad),
            Err(WorkTreeError::NotWritable {
                problem: WriteProblem::MalformedRestore { .. },
                ..
            })
        ));
        assert_eq!(wt.hash().expect("hash"), before);
    }

    #[test]
    fn caches_at_any_depth_are_not_hashed_or_read() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        fs::create_dir_all(root.join("tests")).expect("mkdir");
        fs::write(root.join("tests/t1.sql"), "t1").expect("seed");
        let plain = WorkTree::open(root).expect("open");
        let custom = WorkTree::open(root)
            .expect("open")
            .with_filter(TreeFilter::new(&["build"]));
        let h = plain.hash().expect("hash");
        let hc = custom.hash().expect("hash");
        for planted in [
            "tests/__pycache__/t1.cpython-311.pyc",
            "sub/target/x",
            "target/debug/app",
            "web/node_modules/left-pad/index.js",
            "py/.venv/lib/site.py",
            "vendor/lib/.git/config",
            "sub/.consort/ledger.jsonl",
        ] {
            let full = root.join(planted);
            fs::create_dir_all(full.parent().expect("parent")).expect("mkdir");
            fs::write(&full, "cache").expect("plant");
        }
        assert_eq!(plain.hash().expect("hash"), h, "no default cache is hashed");
        assert_eq!(
            plain
                .file_hashes()
                .expect("hashes")
                .keys()
                .collect::<Vec<_>>(),
            vec!["tests/t1.sql"]
        );
        assert!(
            plain
                .read_matching(|_| true, usize::MAX)
                .expect("read")
                .keys()
                .eq(["tests/t1.sql"])
        );
        fs::create_dir_all(root.join("out/build")).expect("mkdir");
        fs::write(root.join("out/build/x.o"), "obj").expect("plant");
        assert_eq!(
            custom.hash().expect("hash"),
            hc,
            "an extra name is skipped too"
        );
        assert_ne!(
            plain.hash().expect("hash"),
            h,
            "but only where it is configured"
        );
        assert_eq!(
            WorkTree::open(root)
                .expect("open")
                .with_filter(TreeFilter::new(&["build"]))
                .hash()
                .expect("hash"),
            hc,
            "the verifier's hash is the conductor's"
        );
        // A file merely called like a cache directory is hashed.
        fs::write(root.join("tests/target"), "a file").expect("seed");
        assert_ne!(custom.hash().expect("hash"), hc);
    }

    /// The tree's hash, pinned: ledger lines and receipts hold it, so a tree of the same content
    /// must hash to the same value whatever the cache did (the value was taken from the hashing
    /// before the cache existed).
    #[test]
    fn the_tree_hash_is_pinned() {
        let (dir, wt) = tree_with(&[("a.sql", "a"), ("consort.toml", "")]);
        fs::create_dir_all(dir.path().join("src/deep")).expect("mkdir");
        fs::write(dir.path().join("src/deep/b.sql"), "bb\r\n").expect("seed");
        fs::write(dir.path().join("blob.bin"), [0xff, 0x00, 0x80]).expect("seed");
        assert_eq!(
            wt.hash().expect("hash").to_hex(),
            "e8c5e4a04b4e941e9025dbf886ffa1fcfbf789d21f73478190e66467520a404c"
        );
    }

    #[test]
    fn consort_state_is_not_part_of_the_hash() {
        let (dir, wt) = tree_with(&[("a.sql", "a")]);
        let h = wt.hash().expect("hash");
        fs::create_dir_all(dir.path().join(".consort")).expect("mkdir");
        fs::write(dir.path().join(".consort/ledger.jsonl"), "{}").expect("seed");
        assert_eq!(wt.hash().expect("hash"), h);
    }
    #[test]
    fn names_are_spelled_as_before_backslashes_and_bytes_that_are_not_utf8() {
        use std::os::unix::ffi::OsStrExt;
        let (dir, wt) = tree_with(&[]);
        fs::create_dir_all(dir.path().join("d\\x")).expect("mkdir");
        fs::write(dir.path().join("d\\x/a\\b.sql"), "1").expect("seed");
        let odd = std::ffi::OsStr::from_bytes(b"n\xffm.sql");
        fs::write(dir.path().join(odd), "2").expect("seed");
        let hashes = warm_is_cold(&wt);
        assert_eq!(
            hashes.keys().collect::<Vec<_>>(),
            vec!["d/x/a/b.sql", "n\u{fffd}m.sql"]
        );
        assert_eq!(
            wt.files().expect("files"),
            vec!["d/x/a/b.sql", "n\u{fffd}m.sql"]
        );
    }

    // ---------------------------------------------------------------- the hash cache

    /// An hour from now: every stat a pass finds is safely old, so the tests below reach the
    /// stat comparison itself (a racy entry would be read again whatever its stat).
    fn an_hour_ahead() -> std::time::SystemTime {
        std::time::SystemTime::now() + std::time::Duration::from_secs(3600)
    }

    /// A work tree of these files whose cache trusts a stat at once.
    fn settled_tree(files: &[(&str, &str)]) -> (tempfile::TempDir, WorkTree) {
        let (dir, wt) = tree_with(files);
        wt.lock_cache().set_clock(an_hour_ahead);
        (dir, wt)
    }

    /// What hashing was before the cache: a serial walk, every file read, each inserted in
    /// the walk's order.
    fn read_every_file(wt: &WorkTree) -> FileHashes {
        let mut out = BTreeMap::new();
        walk(wt.root(), "", wt.filter(), &mut |rel, full, _| {
            let bytes = fs::read(full).map_err(io_err("read", full))?;
            out.insert(rel.to_string(), ContentHash::of_bytes(&bytes));
            Ok(())
        })
        .expect("read every file");
        out
    }

    /// Hashes through the cache and checks the answer against a fresh handle's and against
    /// reading every file.
    fn warm_is_cold(wt: &WorkTree) -> FileHashes {
        let warm = wt.file_hashes().expect("warm hashes");
        let cold = WorkTree::open(wt.root())
            .expect("open")
            .with_filter(wt.filter().clone())
            .file_hashes()
            .expect("cold hashes");
        assert_eq!(warm, cold, "the cache answers what a fresh handle answers");
        assert_eq!(
            warm,
            read_every_file(wt),
            "and what reading every file answers"
        );
        warm
    }

    /// Fills the cache and checks that `rel`'s entry is trusted from now on: the next pass
    /// reuses its hash unless a stat field moved.
    fn primed(wt: &WorkTree, rel: &str) -> ContentHash {
        let hashes = warm_is_cold(wt);
        assert_eq!(wt.lock_cache().is_settled(rel), Some(true), "{rel} settled");
        hashes[rel]
    }

    fn set_mtime(path: &Path, when: std::time::SystemTime) {
        let file = fs::File::options()
            .write(true)
            .open(path)
            .expect("open for times");
        file.set_times(fs::FileTimes::new().set_modified(when))
            .expect("utimensat");
    }

    #[test]
    fn a_same_size_rewrite_in_the_same_second_is_seen() {
        use std::os::unix::fs::MetadataExt;
        let (dir, wt) = settled_tree(&[("a.sql", "aaaa"), ("b.sql", "b")]);
        let before = primed(&wt, "a.sql");
        let path = dir.path().join("a.sql");
        let old = fs::metadata(&path).expect("stat");
        fs::write(&path, "bbbb").expect("rewrite in place");
        let new = fs::metadata(&path).expect("stat");
        assert_eq!(
            (old.ino(), old.len()),
            (new.ino(), new.len()),
            "same inode, same size"
        );
        let after = warm_is_cold(&wt);
        assert_ne!(after["a.sql"], before);
        assert_eq!(after["a.sql"], ContentHash::of_bytes(b"bbbb"));
    }

    #[test]
    fn a_rewrite_with_its_old_mtime_put_back_is_seen() {
        use std::os::unix::fs::MetadataExt;
        let (dir, wt) = settled_tree(&[("a.sql", "aaaa")]);
        let before = primed(&wt, "a.sql");
        let path = dir.path().join("a.sql");
        let old = fs::metadata(&path).expect("stat");
        fs::write(&path, "bbbb").expect("rewrite in place");
        set_mtime(&path, old.modified().expect("mtime"));
        let new = fs::metadata(&path).expect("stat");
        assert_eq!(
            (old.ino(), old.len(), old.mtime(), old.mtime_nsec()),
            (new.ino(), new.len(), new.mtime(), new.mtime_nsec()),
            "only the ctime tells"
        );
        assert_ne!(warm_is_cold(&wt)["a.sql"], before);
    }

    #[test]
    fn a_file_replaced_by_rename_is_seen() {
        use std::os::unix::fs::MetadataExt;
        let (dir, wt) = settled_tree(&[("a.sql", "aaaa"), ("b.sql", "bbbb")]);
        let (a, b) = (primed(&wt, "a.sql"), primed(&wt, "b.sql"));
        let path = dir.path().join("a.sql");
        let old = fs::metadata(&path).expect("stat");
        let tmp = dir.path().join("a.sql.new");
        fs::write(&tmp, "cccc").expect("new file");
        set_mtime(&tmp, old.modified().expect("mtime"));
        fs::rename(&tmp, &path).expect("rename over");
        assert_ne!(fs::metadata(&path).expect("stat").ino(), old.ino());
        let after = warm_is_cold(&wt);
        assert_ne!(after["a.sql"], a);
        // Two files of one size swapped by renames: each path now holds the other's inode.
        let swap = dir.path().join("swap");
        fs::rename(dir.path().join("a.sql"), &swap).expect("rename");
        fs::rename(dir.path().join("b.sql"), &path).expect("rename");
        fs::rename(&swap, dir.path().join("b.sql")).expect("rename");
        let swapped = warm_is_cold(&wt);
        assert_eq!(swapped["a.sql"], b);
        assert_eq!(swapped["b.sql"], after["a.sql"]);
    }

    #[test]
    fn deleted_files_and_files_turned_into_links_or_directories_leave_the_cache() {
        let (dir, wt) = settled_tree(&[("gone.sql", "x"), ("link.sql", "x"), ("dir.sql", "x")]);
        fs::write(dir.path().join("keep.sql"), "x").expect("seed");
        primed(&wt, "gone.sql");
        assert_eq!(wt.lock_cache().len(), 4);
        fs::remove_file(dir.path().join("gone.sql")).expect("delete");
        fs::remove_file(dir.path().join("link.sql")).expect("delete");
        std::os::unix::fs::symlink("keep.sql", dir.path().join("link.sql")).expect("symlink");
        fs::remove_file(dir.path().join("dir.sql")).expect("delete");
        fs::create_dir(dir.path().join("dir.sql")).expect("mkdir");
        fs::write(dir.path().join("dir.sql/inner.sql"), "x").expect("seed");
        let after = warm_is_cold(&wt);
        assert_eq!(
            after.keys().collect::<Vec<_>>(),
            vec!["dir.sql/inner.sql", "keep.sql"]
        );
        assert_eq!(wt.lock_cache().len(), 2, "only what the walk saw stays");
        // A permission change moves the stat: read again, same content, same hash.
        let keep = dir.path().join("keep.sql");
        let mut perms = fs::metadata(&keep).expect("stat").permissions();
        perms.set_readonly(true);
        fs::set_permissions(&keep, perms).expect("chmod");
        assert_eq!(warm_is_cold(&wt), after);
    }

    #[test]
    fn a_racy_entry_is_read_again_until_it_is_safely_old() {
        let (dir, wt) = tree_with(&[("a.sql", "a")]);
        let written = fs::metadata(dir.path().join("a.sql"))
            .and_then(|m| m.modified())
            .expect("mtime");
        // The clock of the pass that records the file reads the moment it was written.
        wt.lock_cache().set_clock(move || written);
        warm_is_cold(&wt);
        assert_eq!(wt.lock_cache().is_settled("a.sql"), Some(false));
        // What a write in the same timestamp tick, after the read, would leave: a hash that
        // is no longer the content, under an unchanged stat.
        let stale = ContentHash::of_bytes(b"stale");
        wt.lock_cache().poke("a.sql", stale);
        assert_eq!(
            wt.file_hashes().expect("hashes")["a.sql"],
            ContentHash::of_bytes(b"a"),
            "a racy entry is read again, whatever its stat"
        );
        wt.lock_cache().poke("a.sql", stale);
        assert_eq!(
            wt.file_hashes().expect("hashes")["a.sql"],
            ContentHash::of_bytes(b"a")
        );
        // Once a pass finds it safely old, it is trusted: the next pass reads nothing.
        wt.lock_cache().set_clock(an_hour_ahead);
        warm_is_cold(&wt);
        assert_eq!(wt.lock_cache().is_settled("a.sql"), Some(true));
        wt.lock_cache().poke("a.sql", stale);
        assert_eq!(
            wt.file_hashes().expect("hashes")["a.sql"],
            stale,
            "a settled entry whose stat matches is reused without a read"
        );
    }

    #[test]
    fn clones_share_one_cache_and_the_filter_still_decides() {
        let (dir, wt) = settled_tree(&[("a.sql", "a")]);
        fs::create_dir_all(dir.path().join("out/build")).expect("mkdir");
        fs::write(dir.path().join("out/build/x.o"), "obj").expect("seed");
        let clone = wt.clone();
        warm_is_cold(&wt);
        assert_eq!(
            clone.lock_cache().len(),
            2,
            "the clone sees what the handle hashed"
        );
        let filtered = clone.with_filter(TreeFilter::new(&["build"]));
        let hashes = warm_is_cold(&filtered);
        assert_eq!(hashes.keys().collect::<Vec<_>>(), vec!["a.sql"]);
        assert_eq!(wt.lock_cache().len(), 1, "a skipped file leaves the cache");
        assert_eq!(
            warm_is_cold(&wt).len(),
            2,
            "and comes back when it is hashed again"
        );
    }

    #[test]
    fn names_that_read_alike_resolve_as_the_serial_walk_did() {
        use std::os::unix::ffi::OsStrExt;
        let (dir, wt) = settled_tree(&[]);
        let root = dir.path();
        // Two directories whose names are not UTF-8 and read alike, and a file whose
        // backslash reads as the separator of a directory beside it.
        for (d, content) in [(&b"\xfe"[..], "fe"), (&b"\xff"[..], "ff")] {
            let d = root.join(std::ffi::OsStr::from_bytes(d));
            fs::create_dir(&d).expect("mkdir");
            fs::write(d.join("a.sql"), content).expect("seed");
        }
        fs::create_dir(root.join("a")).expect("mkdir");
        fs::write(root.join("a/b"), "the directory's").expect("seed");
        fs::write(root.join("a\\b"), "the file's").expect("seed");
        for _ in 0..2 {
            let hashes = warm_is_cold(&wt);
            assert_eq!(hashes["\u{fffd}/a.sql"], ContentHash::of_bytes(b"ff"));
            assert_eq!(hashes["a/b"], ContentHash::of_bytes(b"the file's"));
            assert_eq!(hashes.len(), 2);
        }
    }

    #[test]
    fn a_deep_wide_tree_is_hashed_whole_by_every_worker() {
        let (dir, wt) = settled_tree(&[]);
        // More files than a pass finds alone before it starts its other threads.
        for d in 0..60 {
            let sub = dir.path().join(format!("d{}/e{}/f{}", d % 5, d % 7, d));
            fs::create_dir_all(&sub).expect("mkdir");
            for f in 0..6 {
                fs::write(sub.join(format!("{f}.sql")), format!("{d}/{f}")).expect("seed");
            }
        }
        fs::create_dir_all(dir.path().join("d1/target/deep")).expect("mkdir");
        fs::write(dir.path().join("d1/target/deep/x"), "cache").expect("seed");
        let first = warm_is_cold(&wt);
        assert_eq!(first.len(), 360);
        let file = dir.path().join("d3/e3/f3/0.sql");
        fs::write(&file, "changed").expect("rewrite");
        let second = warm_is_cold(&wt);
        assert_eq!(second["d3/e3/f3/0.sql"], ContentHash::of_bytes(b"changed"));
        assert_eq!(wt.lock_cache().len(), 360);
    }

    #[test]
    fn a_pass_that_fails_stops_and_the_next_one_starts_afresh() {
        let (dir, wt) = settled_tree(&[("a.sql", "a")]);
        let before = warm_is_cold(&wt);
        let root = wt.root().to_path_buf();
        fs::remove_dir_all(&root).expect("remove the tree");
        assert!(matches!(
            wt.file_hashes(),
            Err(WorkTreeError::Io(PathIoError { op: "list", .. }))
        ));
        fs::create_dir_all(&root).expect("recreate");
        fs::write(root.join("a.sql"), "a").expect("seed");
        assert_eq!(warm_is_cold(&wt), before);
        drop(dir);
    }

    #[test]
    fn a_cache_poisoned_mid_pass_is_emptied_not_trusted() {
        let (_dir, wt) = settled_tree(&[("a.sql", "a")]);
        let before = warm_is_cold(&wt);
        let held = wt.clone();
        let panicked = std::thread::spawn(move || {
            let _cache = held.lock_cache();
            panic!("a panic in the middle of a pass");
        })
        .join();
        assert!(panicked.is_err());
        assert_eq!(wt.lock_cache().len(), 0);
        assert_eq!(warm_is_cold(&wt), before);
    }
}
