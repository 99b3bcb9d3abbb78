//! Test support shared by the workspace's tests; a dev-dependency only
//! (docs/architecture.md: nothing ships with it).
//!
//! - [`tree`]: a directory tree of given files and directories;
//! - [`patterned`]: file content that compresses, but not to nothing;
//! - [`image`] and [`layer`]: an image built from such a tree in-process
//!   (`sheaf_build::build`, no executable), as the union's unit tests and
//!   the stack tests both need;
//! - [`sheaf`] (feature `cli`): the `sheaf` command run in-process through
//!   `sheaf_cli::run`, its exit code, stdout and stderr collected, for
//!   tests of what a command decides and prints that need no process of
//!   their own (no mount, no signal, no environment of their own, no
//!   working directory of their own, no standard input).

use sheaf_build::{build, BuildOptions, BuildReport, Input, Progress};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Make the entries `(path, content)` under `root` (created if missing): a
/// path ending in `/` is a directory (its content ignored), any other a
/// file with that content, its parent directories made as needed.
pub fn tree<P: AsRef<str>, C: AsRef<[u8]>>(root: &Path, entries: &[(P, C)]) {
    fs::create_dir_all(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    for (p, c) in entries {
        let p = p.as_ref();
        let at = root.join(p.trim_end_matches('/'));
        if p.ends_with('/') {
            fs::create_dir_all(&at).unwrap_or_else(|e| panic!("{}: {e}", at.display()));
        } else {
            let parent = at.parent().expect("a file's path has a parent");
            fs::create_dir_all(parent).unwrap_or_else(|e| panic!("{}: {e}", parent.display()));
            fs::write(&at, c).unwrap_or_else(|e| panic!("{}: {e}", at.display()));
        }
    }
}

/// `len` bytes of a pattern that zstd shrinks, but not to nothing (a
/// block of them takes real decoding, and a prefix of it is a prefix).
pub fn patterned(len: usize) -> Vec<u8> {
    (0..len as u32)
        .map(|i| ((i / 7) ^ (i / 4099)).to_le_bytes()[0])
        .collect()
}

/// Build the directory `src` into the image `out` in-process with
/// `opts`, panicking (with the builder's message) if it fails.
pub fn build_dir(src: &Path, out: &Path, opts: &BuildOptions) -> BuildReport {
    build(
        &Input::Dir(src.to_path_buf()),
        out,
        opts,
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap_or_else(|e| panic!("building {} into {}: {e}", src.display(), out.display()))
}

/// The image `dir/NAME.sheaf` of the tree `dir/NAME` made from `entries`
/// ([`tree`]), built in-process with default options.
pub fn image<P: AsRef<str>, C: AsRef<[u8]>>(dir: &Path, name: &str, entries: &[(P, C)]) -> PathBuf {
    let src = dir.join(name);
    tree(&src, entries);
    let out = dir.join(format!("{name}.sheaf"));
    build_dir(&src, &out, &BuildOptions::default());
    out
}

/// [`image`], opened: a layer for a `sheaf_read::Stack` or a union.
pub fn layer<P: AsRef<str>, C: AsRef<[u8]>>(
    dir: &Path,
    name: &str,
    entries: &[(P, C)],
) -> Arc<sheaf_read::Image> {
    let out = image(dir, name, entries);
    Arc::new(
        sheaf_read::open_path(&out).unwrap_or_else(|e| panic!("opening {}: {e}", out.display())),
    )
}

#[cfg(feature = "cli")]
mod run;
#[cfg(feature = "cli")]
pub use run::{sheaf, Out};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tree_holds_what_it_was_given_and_its_image_lists_it() {
        let t = tempfile::tempdir().unwrap();
        let img = layer(
            t.path(),
            "l",
            &[("a/b/c.txt", "see"), ("empty/", ""), ("top", "x")],
        );
        assert_eq!(fs::read(t.path().join("l/a/b/c.txt")).unwrap(), b"see");
        assert!(t.path().join("l/empty").is_dir());
        let root = img.resolve(b"").unwrap();
        let names: Vec<Vec<u8>> = img
            .read_dir(&root, 0, img.dir_len(&root).unwrap() as usize)
            .unwrap()
            .into_iter()
            .map(|e| e.name)
            .collect();
        assert_eq!(names, [b"a".to_vec(), b"empty".to_vec(), b"top".to_vec()]);
        let c = img.resolve(b"a/b/c.txt").unwrap();
        let mut buf = [0u8; 8];
        let n = img.read(&c, 0, &mut buf).unwrap();
        assert_eq!(&buf[..n], b"see");
    }
}
