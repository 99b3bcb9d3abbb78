//! Build → extract round trip of a tree holding every file type and
//! attribute sheaf stores, compared entry by entry with the source; plus
//! `ls -lR`, `cat` and `info --json` checked against the same source.
//!
//! The fixture (with a >4 GiB sparse file) is made and packed once and
//! shared by most tests of this file; the last of them to finish removes it.

mod common;

use common::*;
use std::collections::BTreeMap;
use std::fs;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// Number of #[test]s below that use the shared fixture.
const TESTS: usize = 9;

/// Offset of the second data run of the sparse file: the hole between the
/// runs is 4 GiB, more than a u32 can count.
const SPARSE_TAIL: u64 = (4 << 30) + (1 << 20);
const SPARSE_RUN: usize = 100 * 1024;
const NON_UTF8: &[u8] = b"names/bytes-\xff\xfe-here";

struct Fixture {
    dir: PathBuf,
    src: PathBuf,
    img: PathBuf,
    out: PathBuf,
    extract_stderr: String,
    /// Parts of the fixture that could not be made here (not root, no fs support).
    skipped: Vec<String>,
}

static FIXTURE: OnceLock<Fixture> = OnceLock::new();
static FINISHED: AtomicUsize = AtomicUsize::new(0);

/// Counts finished tests (even failing ones) and removes the fixture after the last.
struct Done;
impl Drop for Done {
    fn drop(&mut self) {
        if FINISHED.fetch_add(1, Ordering::SeqCst) + 1 == TESTS {
            if let Some(f) = FIXTURE.get() {
                let _ = fs::remove_dir_all(&f.dir);
            }
        }
    }
}

fn fixture() -> (&'static Fixture, Done) {
    (FIXTURE.get_or_init(make_fixture), Done)
}

fn capability_v2() -> Vec<u8> {
    // struct vfs_cap_data, revision 2: magic_etc, then {permitted, inheritable} x2.
    let mut v = Vec::new();
    v.extend_from_slice(&(0x0200_0000u32 | 1).to_le_bytes()); // VFS_CAP_REVISION_2 | EFFECTIVE
    v.extend_from_slice(&(1u32 << 10).to_le_bytes()); // CAP_NET_BIND_SERVICE permitted
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v
}

fn posix_acl(named_uid: u32) -> Vec<u8> {
    // posix_acl_xattr_header (version 2) + entries {tag u16, perm u16, id u32}, sorted by tag.
    let mut v = 2u32.to_le_bytes().to_vec();
    let undef = u32::MAX;
    for (tag, perm, id) in [
        (0x01u16, 6u16, undef),
        (0x02, 4, named_uid),
        (0x04, 4, undef),
        (0x10, 4, undef),
        (0x20, 4, undef),
    ] {
        v.extend_from_slice(&tag.to_le_bytes());
        v.extend_from_slice(&perm.to_le_bytes());
        v.extend_from_slice(&id.to_le_bytes());
    }
    v
}

fn try_xattr(p: &Path, name: &str, value: &[u8], skipped: &mut Vec<String>) {
    if let Err(e) = xattr::set(p, name, value) {
        skipped.push(format!("xattr {name} on {}: {e}", p.display()));
    }
}

fn make_fixture() -> Fixture {
    // A fixed place, emptied first, so a run that did not reach the cleanup
    // (a filtered or killed run) leaves at most one stale copy behind.
    let dir = std::env::temp_dir().join(format!("sheaf-roundtrip-fixture-{}", unsafe {
        libc::geteuid()
    }));
    if dir.exists() {
        fs::remove_dir_all(&dir).unwrap();
    }
    fs::create_dir(&dir).unwrap();
    let src = dir.join("src");
    let root = is_root();
    let mut skipped = Vec::new();
    let mut r = Rng::new(7);
    let p = |rel: &str| src.join(rel);
    for d in [
        "dir/nested/inner",
        "links",
        "hard",
        "hard2",
        "special",
        "modes",
        "owned",
        "xattr/d",
        "names",
        "dups",
    ] {
        fs::create_dir_all(p(d)).unwrap();
    }
    // Regular files.
    write(&p("empty"), b"");
    write(&p("small.txt"), b"hello, sheaf\n");
    write(&p("multi.bin"), &r.bytes(3 * (1 << 20) + (1 << 19) + 3)); // ~3.5 MiB, 4 blocks
    write(&p("dir/nested/inner/file.txt"), &r.text(10_000));
    let dup_small = r.text(2_000);
    let dup_big = r.bytes(2 * (1 << 20) + 1234);
    for n in ["dups/a.txt", "dups/b.txt", "dir/c.txt"] {
        write(&p(n), &dup_small);
    }
    for n in ["dups/big1.bin", "dups/big2.bin"] {
        write(&p(n), &dup_big);
    }
    {
        let mut f = fs::File::create(p("sparse.img")).unwrap();
        f.write_all(&r.bytes(SPARSE_RUN)).unwrap();
        f.seek(SeekFrom::Start(SPARSE_TAIL)).unwrap();
        f.write_all(&r.bytes(SPARSE_RUN)).unwrap();
    }
    // Symlinks.
    symlink(b"../small.txt", &p("links/relative"));
    symlink(b"/etc/hostname", &p("links/absolute"));
    symlink(b"no/such/target", &p("links/dangling"));
    // Three names, one inode.
    write(&p("hard/one"), &r.text(3000));
    fs::hard_link(p("hard/one"), p("hard/two")).unwrap();
    fs::hard_link(p("hard/one"), p("hard2/three")).unwrap();
    // Special files.
    let c = std::ffi::CString::new(p("special/fifo").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o640) }, 0);
    drop(std::os::unix::net::UnixListener::bind(p("special/sock")).expect("bind unix socket"));
    if root {
        mknod(
            &p("special/chr"),
            libc::S_IFCHR | 0o620,
            libc::makedev(1, 3),
        )
        .expect("mknod c");
        mknod(
            &p("special/blk"),
            libc::S_IFBLK | 0o660,
            libc::makedev(7, 129),
        )
        .expect("mknod b");
    } else {
        skipped.push("devices (not root)".into());
    }
    // Ownership (before modes: chown clears setuid/setgid).
    if root {
        write(&p("owned/file"), b"owned\n");
        fs::create_dir(p("owned/dir")).unwrap();
        symlink(b"file", &p("owned/link"));
        for n in ["owned/file", "owned/dir", "owned/link", "owned"] {
            lchown(&p(n), 1234, 5678);
        }
    } else {
        skipped.push("chown 1234:5678 (not root)".into());
    }
    // Modes.
    for (n, mode) in [
        ("modes/suid", 0o4755),
        ("modes/sgid", 0o2755),
        ("modes/none", 0o0000),
        ("modes/private", 0o600),
        ("modes/sticky-file", 0o1644),
    ] {
        if mode == 0 && !root {
            // A non-root build could not read it (`make check` runs as an
            // ordinary user).
            skipped.push(format!("{n} with mode 000 (not root)"));
            continue;
        }
        write(&p(n), n.as_bytes());
        chmod(&p(n), mode);
    }
    for (n, mode) in [
        ("modes/sgid-dir", 0o2755),
        ("modes/sticky-dir", 0o1777),
        ("modes/closed-dir", 0o0000),
    ] {
        if mode == 0 && !root {
            continue; // a non-root walk could not read it
        }
        fs::create_dir(p(n)).unwrap();
        if n == "modes/sgid-dir" {
            write(&p("modes/sgid-dir/inside"), b"x");
        }
        chmod(&p(n), mode);
    }
    if root {
        lchown(&p("modes/sgid"), 0, 5678);
        chmod(&p("modes/sgid"), 0o2755);
    }
    // Extended attributes.
    write(&p("xattr/user"), b"with user xattrs\n");
    try_xattr(&p("xattr/user"), "user.plain", b"value", &mut skipped);
    try_xattr(&p("xattr/user"), "user.empty", b"", &mut skipped);
    try_xattr(
        &p("xattr/user"),
        "user.binary",
        &[0, 1, 2, 255, 0, 10],
        &mut skipped,
    );
    try_xattr(&p("xattr/d"), "user.on-a-dir", b"dir value", &mut skipped);
    try_xattr(&src, "user.on-the-root", b"root value", &mut skipped);
    write(&p("xattr/acl"), b"acl\n");
    try_xattr(
        &p("xattr/acl"),
        "system.posix_acl_access",
        &posix_acl(1234),
        &mut skipped,
    );
    try_xattr(
        &p("xattr/d"),
        "system.posix_acl_default",
        &posix_acl(4321),
        &mut skipped,
    );
    if root {
        write(&p("xattr/trusted"), b"trusted\n");
        try_xattr(
            &p("xattr/trusted"),
            "trusted.sheaf-test",
            b"only root sees this",
            &mut skipped,
        );
        write(&p("xattr/cap"), b"#!/bin/false\n");
        chmod(&p("xattr/cap"), 0o755);
        try_xattr(
            &p("xattr/cap"),
            "security.capability",
            &capability_v2(),
            &mut skipped,
        );
    } else {
        skipped.push("trusted.* and security.capability (not root)".into());
    }
    // Awkward names.
    for n in [
        &b"names/new\nline"[..],
        NON_UTF8,
        b"names/with  spaces ",
        b"names/-leading-dash",
        b"names/--",
        b"names/tab\there",
    ] {
        write(&join(&src, n), n);
    }
    let long: String = "0123456789".repeat(26)[..255].to_string();
    write(&p(&format!("names/{long}")), b"255-byte name\n");
    fs::create_dir(p(&format!("names/d{}", &long[1..]))).unwrap();
    // Deep path: 40 components of 60 bytes.
    let mut deep = p("deep");
    for level in 0..40 {
        deep.push(format!("{level:02}-{}", "d".repeat(57)));
    }
    fs::create_dir_all(&deep).unwrap();
    write(&deep.join("bottom.txt"), b"at the bottom\n");
    assert!(deep.as_os_str().len() - src.as_os_str().len() < 4000);
    // Everything is in place: now the mtimes (some before 1970), root included.
    chmod(&src, 0o755);
    set_all_mtimes(&src, |i, _| {
        let sec = 1_500_000_000 + i as i64 * 1001 - if i % 5 == 3 { 1_600_000_000 } else { 0 };
        (sec, ((i as u64 * 987_654_321 + 1) % 1_000_000_000) as u32)
    });

    let img = dir.join("image.sheaf");
    build(&src, &img, &["--block-size", "1M"]); // the fixture sizes assume 1 MiB blocks
    let out = dir.join("out");
    let x = extract_preserving(&img, &out);
    if !skipped.is_empty() {
        eprintln!("roundtrip fixture: not made here: {skipped:?}");
    }
    Fixture {
        dir,
        src,
        img,
        out,
        extract_stderr: x.stderr,
        skipped,
    }
}

#[test]
fn extracted_tree_matches_source_in_every_attribute() {
    let (f, _done) = fixture();
    if is_root() {
        assert!(
            f.skipped.is_empty(),
            "parts of the fixture could not be made: {:?}",
            f.skipped
        );
        let x = xattrs(&f.src.join("xattr/acl"));
        assert!(
            x.contains_key(&b"system.posix_acl_access"[..]),
            "no ACL on the source: {x:?}"
        );
    }
    assert_same_tree(&f.src, &f.out, Cmp::all());
    if is_root() {
        assert!(
            !f.extract_stderr.contains("could not be restored"),
            "extract as root left attributes unrestored: {}",
            f.extract_stderr
        );
    }
}

/// The same comparison against a FUSE mount of the image (`sheaf mount`).
#[test]
fn mounted_tree_matches_source_in_every_attribute() {
    if !mounts_allowed() {
        return;
    }
    let (f, _done) = fixture();
    let guard = mount(&[&f.img], &f.dir.join("mnt"), &[]);
    assert_tree_eq(&guard.mp, &f.src);
    guard.umount();
}

/// The same comparison against the kernel's EROFS mount of the image
/// (`sheaf mount --kernel`): every type, attribute, ACL and capability, the
/// 4 GiB hole, names that are not UTF-8, hardlinked special files.
#[test]
fn kernel_mounted_tree_matches_source_in_every_attribute() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let (f, _done) = fixture();
    let cache = format!("kernel_cache={}", f.dir.join("kcache").display());
    let guard = mount(
        &[&f.img],
        &f.dir.join("kmnt"),
        &["--kernel=require", "-o", &cache],
    );
    assert_tree_eq(&guard.mp, &f.src);
    guard.umount();
}

#[test]
fn sparse_file_is_extracted_sparse() {
    let (f, _done) = fixture();
    let md = fs::metadata(f.out.join("sparse.img")).unwrap();
    assert_eq!(md.size(), SPARSE_TAIL + SPARSE_RUN as u64);
    let on_disk = md.blocks() * 512;
    assert!(
        on_disk < 16 << 20,
        "extracted sparse file of {} bytes occupies {on_disk} bytes on disk",
        md.size()
    );
    // And the image did not store the hole.
    let img_len = fs::metadata(&f.img).unwrap().len();
    assert!(img_len < 64 << 20, "image is {img_len} bytes");
}

#[test]
fn ls_long_recursive_lists_every_path_with_its_attributes() {
    let (f, _done) = fixture();
    // GNU ls's long format, every name (-A), numeric ids, exact times;
    // columns are padded, so runs of spaces are compared as one.
    let o = sheaf([
        "ls".as_ref(),
        f.img.as_os_str(),
        "-lAnR".as_ref(),
        "--time-style=+%s.%N".as_ref(),
    ])
    .ok();
    let squeeze = |l: &str| {
        l.split(' ')
            .filter(|w| !w.is_empty())
            .collect::<Vec<_>>()
            .join(" ")
    };
    // GNU's sections: each directory's entries under its `./DIR:` line.
    let sections: std::collections::HashMap<String, String> = ls_sections(&o.text())
        .into_iter()
        .map(|(dir, lines)| {
            let lines: Vec<String> = lines.iter().map(|l| squeeze(l)).collect();
            (dir, format!("\n{}\n", lines.join("\n")))
        })
        .collect();
    let listing = o.text();
    let mut missing = Vec::new();
    let paths = walk(&f.src);
    for p in &paths[1..] {
        let full = join(&f.src, p);
        let md = fs::symlink_metadata(&full).unwrap();
        let ft = md.mode() & libc::S_IFMT;
        let size = match ft {
            libc::S_IFDIR => fs::read_dir(&full).unwrap().count().to_string(),
            libc::S_IFCHR | libc::S_IFBLK => {
                format!("{}, {}", libc::major(md.rdev()), libc::minor(md.rdev()))
            }
            _ => md.size().to_string(),
        };
        let target = if ft == libc::S_IFLNK {
            format!(
                " -> {}",
                lossy(fs::read_link(&full).unwrap().as_os_str().as_bytes())
            )
        } else {
            String::new()
        };
        let line = squeeze(&format!(
            "{} {:>3} {:>5} {:>5} {:>12} {}.{:09} {}{target}",
            mode_string(md.mode()),
            md.nlink(),
            md.uid(),
            md.gid(),
            size,
            md.mtime(),
            md.mtime_nsec(),
            lossy(p.rsplit(|&b| b == b'/').next().unwrap())
        ));
        let dir = match p.iter().rposition(|&b| b == b'/') {
            Some(i) => format!("./{}", lossy(&p[..i])),
            None => ".".to_string(),
        };
        let section = sections.get(&dir).map_or("", String::as_str);
        if !section.contains(&format!("\n{line}\n")) {
            missing.push(line);
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} entries missing or wrong in `sheaf ls -lR`, e.g.:\n  {}\nlisting starts:\n{}",
        missing.len(),
        paths.len() - 1,
        missing
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  "),
        listing.chars().take(3000).collect::<String>()
    );
    // Without -l: each name in its directory's section (names hold
    // newlines, so sections are searched, not split into lines).
    let plain = sheaf(["ls".as_ref(), f.img.as_os_str(), "-R".as_ref()]).ok();
    let plain = format!("\n{}", plain.text());
    for p in &paths[1..] {
        let (dir, name) = match p.iter().rposition(|&b| b == b'/') {
            Some(i) => (format!("./{}", lossy(&p[..i])), lossy(&p[i + 1..])),
            None => (".".to_string(), lossy(p)),
        };
        let at = plain
            .find(&format!("\n{dir}:\n"))
            .unwrap_or_else(|| panic!("`ls -R` lacks the section {dir:?}"));
        let section = &plain[at + dir.len() + 2..];
        let section = &section[..section.find("\n\n").map_or(section.len(), |e| e + 1)];
        assert!(
            section.contains(&format!("\n{name}\n")),
            "`ls -R` lacks {:?}",
            lossy(p)
        );
    }
}

/// Run `sheaf cat IMG PATH` and compare its stdout, streamed, with `file`.
fn cat_matches(img: &Path, path: &[u8], file: &Path) -> Result<(), String> {
    let mut arg = b"/".to_vec();
    arg.extend_from_slice(path);
    let mut child = cmd()
        .arg("cat")
        .arg(img)
        .arg(std::ffi::OsStr::from_bytes(&arg))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut so = child.stdout.take().unwrap();
    let mut want = fs::File::open(file).unwrap();
    let cmp = same_stream(&mut so, &mut want);
    drop(so);
    let o = child.wait_with_output().unwrap();
    let code = o.status.code().unwrap_or(-1);
    if code != 0 {
        return Err(format!(
            "exit {code}: {}",
            String::from_utf8_lossy(&o.stderr).trim()
        ));
    }
    cmp
}

#[test]
fn cat_returns_every_regular_file_exactly() {
    let (f, _done) = fixture();
    let mut errs = Vec::new();
    let mut n = 0;
    for p in walk(&f.src) {
        let full = join(&f.src, &p);
        if !fs::symlink_metadata(&full).unwrap().is_file() || std::str::from_utf8(&p).is_err() {
            continue; // non-UTF-8 names: see cat_and_ls_address_non_utf8_names
        }
        n += 1;
        if let Err(e) = cat_matches(&f.img, &p, &full) {
            errs.push(format!("{:?}: {e}", lossy(&p)));
        }
    }
    assert!(n > 20, "only {n} files checked");
    assert!(
        errs.is_empty(),
        "sheaf cat differs from the source:\n  {}",
        errs.join("\n  ")
    );
}

#[test]
fn cat_and_ls_address_non_utf8_names() {
    // Names are bytes in the image (and extract restores them), so the path
    // arguments of cat and ls must be able to name them too.
    let (f, _done) = fixture();
    let r = cat_matches(&f.img, NON_UTF8, &join(&f.src, NON_UTF8));
    assert!(
        r.is_ok(),
        "sheaf cat of a file whose name is not UTF-8: {}",
        r.unwrap_err()
    );
    let mut arg = b"/".to_vec();
    arg.extend_from_slice(NON_UTF8);
    let o = run_cmd(
        cmd()
            .arg("ls")
            .arg(&f.img)
            .arg(std::ffi::OsStr::from_bytes(&arg)),
    );
    o.no_panic();
    assert_eq!(o.code, 0, "sheaf ls of a non-UTF-8 path:\n{}", o.describe());
}

#[test]
fn info_json_counts_match_the_fixture() {
    let (f, _done) = fixture();
    let v = json(&sheaf(["info".as_ref(), f.img.as_os_str(), "--json".as_ref()]).ok());
    // Expected: distinct inodes by type, root included.
    let mut seen = std::collections::HashSet::new();
    let mut by_type: BTreeMap<&str, u64> = BTreeMap::new();
    let mut logical = 0u64;
    let mut hardlinked = 0u64;
    for p in walk(&f.src) {
        let md = fs::symlink_metadata(join(&f.src, &p)).unwrap();
        if !seen.insert(md.ino()) {
            continue;
        }
        let t = match md.mode() & libc::S_IFMT {
            libc::S_IFDIR => "directory",
            libc::S_IFREG => "file",
            libc::S_IFLNK => "symlink",
            libc::S_IFCHR => "char-device",
            libc::S_IFBLK => "block-device",
            libc::S_IFIFO => "fifo",
            libc::S_IFSOCK => "socket",
            _ => "other",
        };
        *by_type.entry(t).or_default() += 1;
        if md.is_file() {
            logical += md.size();
        }
        if !md.is_dir() && md.nlink() > 1 {
            hardlinked += 1;
        }
    }
    let want = serde_json::to_value(&by_type).unwrap();
    assert_eq!(
        v["entries_by_type"], want,
        "entries_by_type; skipped parts: {:?}",
        f.skipped
    );
    assert_eq!(v["inodes"].as_u64(), Some(seen.len() as u64), "inodes");
    assert_eq!(v["logical_bytes"].as_u64(), Some(logical), "logical_bytes");
    assert_eq!(
        v["hardlinked_inodes"].as_u64(),
        Some(hardlinked),
        "hardlinked_inodes"
    );
    assert!(
        v["hole_bytes"].as_u64().unwrap_or(0) >= 4 << 30,
        "hole_bytes: {}",
        v["hole_bytes"]
    );
    assert!(
        v["dedup_bytes"].as_u64().unwrap_or(0) >= 2 << 20,
        "dedup_bytes: {}",
        v["dedup_bytes"]
    );
}

#[test]
fn sparse_hole_is_recorded_with_its_full_length() {
    // Every byte of a file is described by exactly one chunk record (data or
    // hole): records are "pieces of a regular file" in file order.
    let (f, _done) = fixture();
    let img = sheaf_read::open_path(&f.img).unwrap();
    let ino = img.resolve(b"/sparse.img").unwrap();
    let mut pos = 0u64;
    let mut pieces = Vec::new();
    for i in 0..ino.rec.count as u64 {
        let c = img.chunk(ino.rec.data + i).unwrap();
        pieces.push(format!(
            "{}+{}{}",
            c.file_offset,
            c.len,
            if c.is_hole() { " (hole)" } else { "" }
        ));
        assert_eq!(
            c.file_offset, pos,
            "chunk {i} of sparse.img does not start where the previous ended: {pieces:?}"
        );
        assert!(c.len > 0, "chunk {i} of sparse.img is empty: {pieces:?}");
        pos += c.len as u64;
    }
    assert_eq!(
        pos, ino.rec.size,
        "chunks of sparse.img cover {pos} of {} bytes: {pieces:?}",
        ino.rec.size
    );
}

#[test]
fn hardlinked_special_files_keep_their_identity() {
    // A hardlinked fifo, symlink, socket (and device, as root) is one inode
    // with nlink 2 in the image; extract must recreate one inode, not two.
    let t = tmpdir();
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let c = std::ffi::CString::new(src.join("fifo").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    fs::hard_link(src.join("fifo"), src.join("fifo-2")).unwrap();
    symlink(b"somewhere", &src.join("sym"));
    fs::hard_link(src.join("sym"), src.join("sym-2")).unwrap();
    drop(std::os::unix::net::UnixListener::bind(src.join("sock")).unwrap());
    fs::hard_link(src.join("sock"), src.join("sock-2")).unwrap();
    if is_root() {
        mknod(
            &src.join("null"),
            libc::S_IFCHR | 0o666,
            libc::makedev(1, 3),
        )
        .unwrap();
        fs::hard_link(src.join("null"), src.join("null-2")).unwrap();
    }
    set_all_mtimes(&src, |i, _| (1_600_000_000 + i as i64, 17));
    let img = t.path().join("x.sheaf");
    build(&src, &img, &[]);
    let out = t.path().join("out");
    extract_preserving(&img, &out);
    assert_same_tree(&src, &out, Cmp::all());
}
