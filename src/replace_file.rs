//! Replacing a small file whole: the one way the root package writes a record another process
//! may read or write at the same time.

use std::io::Write;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};

/// Tells apart the temporary files of one process's writes.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// Writes `bytes` to `path` whole or not at all: into a temporary file of its own beside it
/// (named after this process and write, so two writers at once never share one), synced, then
/// renamed over `path`. A reader sees the old file or the new one, never half of either.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map_or_else(|| "file".into(), |n| n.to_string_lossy().into_owned());
    let tmp = path.with_file_name(format!(
        ".{name}.{}.{}.tmp",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let written = (|| {
        let mut file = std::fs::File::create(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_at_once_each_leave_a_whole_file_and_no_temporary_one() {
        let bodies: Vec<String> = (0..8).map(|n| format!("{n}").repeat(64 * 1024)).collect();
        let tmp = tempfile::tempdir().expect("tmp");
        let path = tmp.path().join("record.json");
        std::thread::scope(|s| {
            for body in &bodies {
                let path = &path;
                s.spawn(move || {
                    for _ in 0..20 {
                        replace_file(path, body.as_bytes()).expect("replaced");
                    }
                });
            }
        });
        let last = std::fs::read_to_string(&path).expect("read");
        assert!(bodies.contains(&last), "one writer's whole body");
        let left: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(left, vec![std::ffi::OsString::from("record.json")]);
    }
}
