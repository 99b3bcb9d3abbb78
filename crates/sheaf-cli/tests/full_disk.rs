//! A full disk: the writer gets ENOSPC or one line, nothing half-written is
//! ever visible, nothing partial is left behind, and images never change.
//! Each case runs on a small tmpfs mounted by the test (root only).

mod common;

use common::*;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A tmpfs of `mib` MiB at `dir`, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn new(dir: &Path, mib: u32) -> SmallFs {
        fs::create_dir_all(dir).unwrap();
        let st = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={mib}m"), "tmpfs"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(st.success(), "mount -t tmpfs {}", dir.display());
        SmallFs(dir.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn listing(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[test]
fn an_overlay_upper_on_a_full_disk_gives_enospc_and_shows_no_half_copy() {
    if !prerequisite(is_root(), "root, to mount a small tmpfs") {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    let big = Rng::new(21).bytes(8 << 20);
    write(&src.join("big.bin"), &big);
    write(&src.join("small.txt"), b"small\n");
    let img = t.path().join("lower.sheaf");
    build(&src, &img, &[]).ok();
    let image_bytes = fs::read(&img).unwrap();
    let small = SmallFs::new(&t.path().join("small"), 4);
    let up = small.0.join("upper");
    fs::create_dir(&up).unwrap();
    let mp = t.path().join("mp");
    let _m = mount(&[&img], &mp, &["--upper", up.to_str().unwrap()]);
    // Appending to the 8 MiB lower file needs a copy-up into 4 MiB.
    let r = fs::OpenOptions::new()
        .append(true)
        .open(mp.join("big.bin"))
        .and_then(|mut f| f.write_all(b"more"));
    assert_eq!(
        r.map_err(|e| e.raw_os_error()),
        Err(Some(libc::ENOSPC)),
        "the writer must get ENOSPC"
    );
    // No half copy: the file reads as the image has it, the upper holds
    // neither the file nor a temporary.
    assert!(
        fs::read(mp.join("big.bin")).unwrap() == big,
        "wrong bytes after ENOSPC"
    );
    assert_eq!(listing(&up), Vec::<String>::new(), "left in the upper");
    // The space came back: a small change still works.
    fs::OpenOptions::new()
        .append(true)
        .open(mp.join("small.txt"))
        .unwrap()
        .write_all(b"more\n")
        .unwrap();
    assert_eq!(fs::read(up.join("small.txt")).unwrap(), b"small\nmore\n");
    drop(_m);
    assert!(fs::read(&img).unwrap() == image_bytes, "the image changed");
}

#[test]
fn build_and_publish_onto_a_full_disk_say_so_in_one_line_and_leave_nothing() {
    if !prerequisite(is_root(), "root, to mount a small tmpfs") {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write(&src.join("random.bin"), &Rng::new(22).bytes(6 << 20));
    small_tree(&src, 4);
    let small = SmallFs::new(&t.path().join("small"), 2);
    let out = small.0.join("out.sheaf");
    let o = sheaf([
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ])
    .fails_with(1);
    let line = o.one_err_line();
    assert!(
        line.contains("out.sheaf") && line.contains("No space left"),
        "{}",
        o.describe()
    );
    assert_eq!(listing(&small.0), Vec::<String>::new(), "left on the disk");
    // publish: the repository gets no partial object or index.
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]).ok();
    let repo = small.0.join("repo");
    let o = sheaf([
        "publish".as_ref(),
        img.as_os_str(),
        repo.as_os_str(),
        "--name".as_ref(),
        "img".as_ref(),
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("No space left"),
        "{}",
        o.describe()
    );
    assert!(!repo.join("img").exists(), "an index was written");
    let partial: Vec<_> = walk(&repo)
        .into_iter()
        .filter(|p| {
            let p = join(&repo, p);
            p.is_file() && {
                // Every object left must be whole: named by its digest.
                let name = p.file_name().unwrap().to_string_lossy().into_owned();
                name.contains('.') || name.starts_with("tmp")
            }
        })
        .collect();
    assert!(partial.is_empty(), "temporaries left: {partial:?}");
}

#[test]
fn bcast_onto_a_full_disk_says_so_in_one_line_and_leaves_no_copy() {
    if !prerequisite(is_root(), "root, to mount a small tmpfs") {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir_all(&src).unwrap();
    write(&src.join("random.bin"), &Rng::new(23).bytes(6 << 20));
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]).ok();
    let small = SmallFs::new(&t.path().join("small"), 2);
    let dest = small.0.join("pools/img.sheaf");
    let o = sheaf([
        "bcast".as_ref(),
        "--mpi".as_ref(),
        "never".as_ref(),
        img.as_os_str(),
        dest.as_os_str(),
    ])
    .fails_with(1);
    let line = o.one_err_line();
    assert!(
        line.contains("img.sheaf") && line.contains("No space left"),
        "{}",
        o.describe()
    );
    // Only the (empty) lock file may remain: no copy, no temporary.
    let left: Vec<String> = listing(&small.0.join("pools"))
        .into_iter()
        .filter(|n| !n.ends_with(".bcast.lock"))
        .collect();
    assert!(left.is_empty(), "left on the disk: {left:?}");
}

#[test]
fn import_onto_a_full_disk_says_so_in_one_line_and_leaves_nothing() {
    if !prerequisite(is_root(), "root, to mount a small tmpfs") {
        return;
    }
    let t = tmpdir();
    // A layout whose first layer (host programs and libraries) unpacks to
    // several MiB.
    let lay = common::oci::layout(t.path());
    let small = SmallFs::new(&t.path().join("small"), 2);
    let out = small.0.join("app.sheaf");
    let o = sheaf([
        "import",
        &lay.oci("gz"),
        "--flatten",
        "-o",
        out.to_str().unwrap(),
        "-q",
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("No space left"),
        "{}",
        o.describe()
    );
    assert_eq!(listing(&small.0), Vec::<String>::new(), "left on the disk");
    let repo = small.0.join("repo");
    let o = sheaf([
        "import",
        &lay.oci("gz"),
        "--publish",
        repo.to_str().unwrap(),
        "-q",
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("No space left"),
        "{}",
        o.describe()
    );
    // No record, no layer index, no temporary directory: at most whole
    // objects (named by their digests) of a layer that never got its index.
    let names = listing(&repo);
    assert!(
        names.iter().all(|n| n == "objects"),
        "left in the repository: {names:?}"
    );
}
