//! An XFS file system with reflinks on a loop device, for what only a file system that clones
//! files shows (PostgreSQL 18's branches as clones). Needs root and `mkfs.xfs` (xfsprogs,
//! which `cargo xtask test` installs as root).

use std::path::{Path, PathBuf};
use std::process::Command;

/// An XFS file system made with `reflink=1` in a sparse image, mounted (mode 0755) until
/// dropped; the image is then removed.
#[derive(Debug)]
pub struct XfsMount {
    /// Where it is mounted.
    pub at: PathBuf,
    image: PathBuf,
}

impl XfsMount {
    /// Makes an image of `size` (as `truncate -s` takes it: `1G`) in `dir` and mounts it at
    /// `dir/xfs`.
    pub fn make(dir: &Path, size: &str) -> XfsMount {
        let (image, at) = (dir.join("xfs.img"), dir.join("xfs"));
        std::fs::create_dir_all(&at).expect("mount point");
        let mounted = XfsMount { at, image };
        let run = |cmd: &mut Command, what: &str| {
            crate::process::succeeded(cmd, what);
        };
        run(
            Command::new("truncate")
                .args(["-s", size])
                .arg(&mounted.image),
            "truncate",
        );
        run(
            Command::new("mkfs.xfs")
                .args(["-q", "-m", "reflink=1"])
                .arg(&mounted.image),
            "mkfs.xfs (from xfsprogs)",
        );
        run(
            Command::new("mount")
                .args(["-o", "loop"])
                .arg(&mounted.image)
                .arg(&mounted.at),
            "mount -o loop (as root)",
        );
        std::fs::set_permissions(
            &mounted.at,
            std::os::unix::fs::PermissionsExt::from_mode(0o755),
        )
        .expect("chmod");
        mounted
    }
}

impl Drop for XfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.at).status();
        let _ = std::fs::remove_file(&self.image);
    }
}
