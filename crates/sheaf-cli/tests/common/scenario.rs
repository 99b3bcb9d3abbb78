//! The scenario most FUSE tests share: make a tree, build an image of it,
//! mount the image with the real binary (a mount daemonises, so it needs a
//! process of its own), assert on what the mount shows, unmount.
//!
//! ```ignore
//! let s = Scenario::new(|src| small_tree(src, 1)).build(&["-c", "none"]);
//! let m = s.mount(&["-o", "cache_size=8M"]);
//! assert_tree_eq(&m.mp, &s.src);
//! ```
//!
//! Here and not in `sheaf-testkit`: mounting runs the binary under test
//! (`CARGO_BIN_EXE_sheaf`, known only to this crate's integration tests)
//! and guards it with [`Mounted`].

use super::{assert_same_tree, build, cmd, is_mounted, tmpdir, Cmp, Mounted};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::Command;

/// `sheaf mount SOURCES... MP ARGS...` (images, or URLs), not yet run;
/// the mount point is created now.
pub fn mount_cmd<S: AsRef<OsStr>>(sources: &[S], mp: &Path, args: &[&str]) -> Command {
    std::fs::create_dir_all(mp).unwrap_or_else(|e| panic!("{}: {e}", mp.display()));
    let mut c = cmd();
    c.arg("mount");
    for s in sources {
        c.arg(s.as_ref());
    }
    c.arg(mp).args(args);
    c
}

/// `sheaf mount SOURCES... MP ARGS...`, asserting success and that `MP`
/// is a mount point when it returns; the mount is taken down when the
/// guard drops.
#[track_caller]
pub fn mount<S: AsRef<OsStr>>(sources: &[S], mp: &Path, args: &[&str]) -> Mounted {
    let m = Mounted::run(&mut mount_cmd(sources, mp, args), mp);
    assert!(is_mounted(mp), "{}: not mounted", mp.display());
    m
}

/// A temporary directory holding a source tree (`src`), the image built
/// from it (`img`) and a mount point (`mp`, made when mounting).
pub struct Scenario {
    dir: tempfile::TempDir,
    /// The source tree: `DIR/src`, or a tree made elsewhere ([`Scenario::of`]).
    pub src: PathBuf,
    /// The image: `DIR/img.sheaf` unless [`Scenario::image_name`] says otherwise.
    pub img: PathBuf,
    /// The mount point: `DIR/mnt`.
    pub mp: PathBuf,
}

impl Scenario {
    /// A fresh directory whose source tree `fill` makes in `DIR/src`
    /// (created empty first).
    pub fn new(fill: impl FnOnce(&Path)) -> Self {
        let dir = tmpdir();
        let src = dir.path().join("src");
        std::fs::create_dir_all(&src).unwrap();
        fill(&src);
        Self::with(dir, src)
    }

    /// A fresh directory for a source tree made elsewhere (a real tree),
    /// which is neither copied nor changed.
    pub fn of(src: &Path) -> Self {
        Self::with(tmpdir(), src.to_path_buf())
    }

    fn with(dir: tempfile::TempDir, src: PathBuf) -> Self {
        let img = dir.path().join("img.sheaf");
        let mp = dir.path().join("mnt");
        Scenario { dir, src, img, mp }
    }

    /// The scenario's directory, for the test's other files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Name the image `DIR/NAME` instead (before building).
    pub fn image_name(mut self, name: &str) -> Self {
        self.img = self.dir.path().join(name);
        self
    }

    /// `sheaf build SRC -o IMG FLAGS...` (in-process), asserting success.
    #[track_caller]
    pub fn build(self, flags: &[&str]) -> Self {
        build(&self.src, &self.img, flags);
        self
    }

    /// `sheaf mount IMG MP ARGS...`, asserting success (see [`mount`]).
    #[track_caller]
    pub fn mount(&self, args: &[&str]) -> Mounted {
        mount(&[&self.img], &self.mp, args)
    }

    /// `sheaf mount IMG MP ARGS...`, not yet run (the mount point made):
    /// for a test that sets its environment or reads its output, then
    /// guards the mount (`Mounted::run(&mut c, &s.mp)`, `Mounted::adopt`).
    pub fn mount_cmd(&self, args: &[&str]) -> Command {
        mount_cmd(&[&self.img], &self.mp, args)
    }
}

/// Assert that the tree at `got` (a mount) holds exactly what `want` (its
/// source) holds: every entry, with the same type, permission bits, owner,
/// size, mtime to the nanosecond, link count, device number, xattrs,
/// symlink target, file bytes and hardlink identity, read through the
/// kernel from both trees, independently of sheaf ([`Cmp::all`]; for less,
/// `assert_same_tree(want, got, cmp)`).
#[track_caller]
pub fn assert_tree_eq(got: &Path, want: &Path) {
    assert_same_tree(want, got, Cmp::all());
}
