//! The operations of a mounted image, called directly (no FUSE, no mount)
//! on small images built here from entry lists: what each test expects
//! comes from the entries it built the image from.

use super::{FsConfig, Readdirplus, SheafFs};
use fuser::{AccessFlags, Errno, FileAttr, FileType, INodeNo, InitFlags};
use sheaf_build::entries::{Entry, EntryKind, EntrySource};
use sheaf_build::{build, BuildError, BuildOptions, Input, Progress};
use sheaf_read::CountingSource;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

const ROOT: INodeNo = INodeNo(1);
const PID: u32 = 4242;

/// One entry to build: path, what it is, xattrs, hardlink key.
#[derive(Debug, Clone)]
struct Spec {
    path: &'static str,
    kind: Kind,
    xattrs: Vec<(&'static str, &'static str)>,
    link: Option<u64>,
}

#[derive(Debug, Clone)]
enum Kind {
    Dir,
    File(Vec<u8>),
    Symlink(&'static str),
    CharDevice(u64),
    Fifo,
}

fn dir(path: &'static str) -> Spec {
    Spec {
        path,
        kind: Kind::Dir,
        xattrs: vec![],
        link: None,
    }
}

fn file(path: &'static str, data: impl Into<Vec<u8>>) -> Spec {
    Spec {
        path,
        kind: Kind::File(data.into()),
        xattrs: vec![],
        link: None,
    }
}

fn other(path: &'static str, kind: Kind) -> Spec {
    Spec {
        path,
        kind,
        xattrs: vec![],
        link: None,
    }
}

#[derive(Debug)]
struct Specs(Vec<Spec>);

impl EntrySource for Specs {
    fn name(&self) -> String {
        "test".into()
    }
    fn entries(&self) -> Box<dyn Iterator<Item = Result<Entry<'_>, BuildError>> + '_> {
        Box::new(self.0.iter().map(|s| {
            let (mode, kind) = match &s.kind {
                Kind::Dir => (libc::S_IFDIR | 0o755, EntryKind::Dir),
                Kind::File(d) => (
                    libc::S_IFREG | 0o644,
                    EntryKind::File(Box::new(std::io::Cursor::new(d.clone()))),
                ),
                Kind::Symlink(t) => (
                    libc::S_IFLNK | 0o777,
                    EntryKind::Symlink(t.as_bytes().to_vec()),
                ),
                Kind::CharDevice(d) => (libc::S_IFCHR | 0o600, EntryKind::Device(*d)),
                Kind::Fifo => (libc::S_IFIFO | 0o600, EntryKind::Special),
            };
            Ok(Entry {
                path: s.path.as_bytes().to_vec(),
                mode,
                uid: 1000,
                gid: 100,
                mtime_sec: 1_700_000_000,
                mtime_nsec: 5,
                xattrs: (s.xattrs.iter())
                    .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
                    .collect(),
                link: s.link,
                kind,
            })
        }))
    }
}

/// Bytes that do not compress (so they are stored as they are).
fn noise(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// An image built from `specs` (the root first) and a filesystem over it.
struct Fixture {
    _tmp: tempfile::TempDir,
    image: PathBuf,
    fs: SheafFs,
}

fn image(dir: &Path, specs: Vec<Spec>) -> PathBuf {
    let out = dir.join("t.sheaf");
    let opts = BuildOptions {
        block_size: 64 << 10,
        pack_size: 16 << 10,
        ..BuildOptions::default()
    };
    build(
        &Input::Entries(Arc::new(Specs(specs))),
        &out,
        &opts,
        Arc::new(Progress::default()),
        &AtomicBool::new(false),
    )
    .unwrap();
    out
}

fn serve(image: &Path, cfg: FsConfig) -> SheafFs {
    let src: Arc<dyn sheaf_read::Source> = Arc::new(sheaf_read::FileSource::open(image).unwrap());
    let counted = Arc::new(CountingSource::new(src));
    let img = Arc::new(sheaf_read::Image::open(counted.clone()).unwrap());
    SheafFs::new(img, counted, cfg)
}

fn fixture_with(specs: Vec<Spec>, cfg: FsConfig) -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let image = image(tmp.path(), specs);
    let fs = serve(&image, cfg);
    Fixture {
        _tmp: tmp,
        image,
        fs,
    }
}

/// The tree most tests read.
fn tree() -> Vec<Spec> {
    let mut a = file("a", "hello\n");
    a.link = Some(1);
    let mut h = file("h", "");
    h.link = Some(1);
    let mut x = file("d/x", "xattrs here");
    x.xattrs = vec![("user.one", "1"), ("user.two", "22")];
    vec![
        dir(""),
        a,
        file("big", noise(200_000, 7)),
        dir("d"),
        x,
        file("d/y", ""),
        dir("d/e"),
        h,
        other("l", Kind::Symlink("a")),
        other("null", Kind::CharDevice(libc::makedev(1, 3))),
        other("pipe", Kind::Fifo),
    ]
}

fn fixture() -> Fixture {
    fixture_with(tree(), FsConfig::default())
}

fn lookup(fs: &SheafFs, parent: INodeNo, name: &str) -> FileAttr {
    fs.lookup(PID, parent, name.as_bytes()).unwrap()
}

fn read_all(fs: &SheafFs, ino: INodeNo, offset: u64, size: u32) -> Result<Vec<u8>, Errno> {
    let mut out = Vec::new();
    fs.read(ino, offset, size, |b| out.extend_from_slice(b))?;
    Ok(out)
}

/// (node, next offset, kind, name) of a whole listing, read `per` entries a
/// reply.
fn listing(fs: &SheafFs, ino: INodeNo, per: usize) -> Vec<(INodeNo, u64, FileType, String)> {
    let mut all: Vec<(INodeNo, u64, FileType, String)> = Vec::new();
    loop {
        let offset = all.last().map_or(0, |e| e.1);
        let mut got = Vec::new();
        fs.readdir(PID, ino, offset, &mut |n, next, kind, name| {
            got.push((n, next, kind, String::from_utf8_lossy(name).into_owned()));
            got.len() == per
        })
        .unwrap();
        if got.is_empty() {
            return all;
        }
        all.extend(got);
    }
}

fn names(l: &[(INodeNo, u64, FileType, String)]) -> Vec<&str> {
    l.iter().map(|e| e.3.as_str()).collect()
}

#[test]
fn lookup_finds_entries_with_their_attributes() {
    let fx = fixture();
    let fs = &fx.fs;
    let a = lookup(fs, ROOT, "a");
    assert_eq!(a.kind, FileType::RegularFile);
    assert_eq!(a.size, 6);
    assert_eq!((a.perm, a.uid, a.gid, a.nlink), (0o644, 1000, 100, 2));
    assert_eq!(
        a.mtime,
        std::time::UNIX_EPOCH + std::time::Duration::new(1_700_000_000, 5)
    );
    // Hardlinks are one inode.
    assert_eq!(lookup(fs, ROOT, "h").ino, a.ino);
    assert_eq!(fs.getattr(a.ino).unwrap(), a);
    let d = lookup(fs, ROOT, "d");
    assert_eq!(d.kind, FileType::Directory);
    assert_eq!(lookup(fs, d.ino, "x").size, 11);
    assert_eq!(lookup(fs, ROOT, "l").kind, FileType::Symlink);
    let null = lookup(fs, ROOT, "null");
    assert_eq!((null.kind, null.rdev), (FileType::CharDevice, 0x103));
    assert_eq!(lookup(fs, ROOT, "pipe").kind, FileType::NamedPipe);
    assert_eq!(fs.getattr(ROOT).unwrap().kind, FileType::Directory);
}

#[test]
fn a_missing_name_is_a_negative_entry_and_not_an_error() {
    let fx = fixture();
    let neg = lookup(&fx.fs, ROOT, "nothing");
    assert_eq!(neg.ino, INodeNo(0));
    let ops = fx.fs.stats().ops();
    assert_eq!(ops["lookup"].count, 1);
    assert_eq!(ops["lookup"].errors, 0);
}

#[test]
fn errors_carry_their_errno() {
    let fx = fixture();
    let fs = &fx.fs;
    let a = lookup(fs, ROOT, "a").ino;
    assert_eq!(fs.lookup(PID, a, b"x"), Err(Errno::ENOTDIR));
    assert_eq!(fs.readlink(a), Err(Errno::EINVAL));
    let nowhere = INodeNo(1 << 40);
    assert_eq!(fs.getattr(nowhere), Err(Errno::ENOENT));
    assert_eq!(fs.lookup(PID, nowhere, b"a"), Err(Errno::ENOENT));
    assert_eq!(read_all(fs, nowhere, 0, 10), Err(Errno::ENOENT));
    assert_eq!(
        fs.readdir(PID, a, 0, &mut |_, _, _, _| false),
        Err(Errno::ENOTDIR)
    );
    assert_eq!(
        fs.readdirplus(PID, nowhere, 0, &mut |_, _, _, _| false),
        Err(Errno::ENOENT)
    );
    assert_eq!(fs.access(nowhere, AccessFlags::R_OK), Err(Errno::ENOENT));
    let d = lookup(fs, ROOT, "d").ino;
    assert_eq!(read_all(fs, d, 0, 10), Err(Errno::EISDIR));
    // ENOENT is an answer, not an error of the mount; the others count.
    let ops = fs.stats().ops();
    assert_eq!(ops["getattr"].errors, 0);
    assert_eq!(ops["readlink"].errors, 1);
    assert_eq!(fs.stats().image_errors.load(Relaxed), 0);
}

#[test]
fn readlink_gives_the_target() {
    let fx = fixture();
    let l = lookup(&fx.fs, ROOT, "l").ino;
    assert_eq!(fx.fs.readlink(l).unwrap(), b"a");
}

#[test]
fn reads_return_the_bytes_at_any_offset() {
    let fx = fixture();
    let fs = &fx.fs;
    let a = lookup(fs, ROOT, "a").ino;
    assert_eq!(read_all(fs, a, 0, 100).unwrap(), b"hello\n");
    assert_eq!(read_all(fs, a, 2, 2).unwrap(), b"ll");
    assert_eq!(read_all(fs, a, 6, 10).unwrap(), b"");
    assert_eq!(read_all(fs, a, 100, 10).unwrap(), b"");
    // Across blocks of 64 KiB, in kernel-sized pieces.
    let big = lookup(fs, ROOT, "big").ino;
    let want = noise(200_000, 7);
    let mut got = Vec::new();
    while got.len() < want.len() {
        got.extend(read_all(fs, big, got.len() as u64, 128 << 10).unwrap());
    }
    assert_eq!(got, want);
    assert_eq!(
        read_all(fs, big, 65_000, 1000).unwrap(),
        &want[65_000..66_000]
    );
    let served = fs.stats().bytes_served.load(Relaxed);
    assert_eq!(served, 6 + 2 + 200_000 + 1000);
    let r = fs.report();
    assert_eq!(r.bytes_served, served);
    assert!(r.image_reads.unwrap() > 0);
    assert!(r.block_cache.misses >= 4);
}

#[test]
fn reads_with_readahead_return_the_same_bytes() {
    let fx = fixture_with(
        tree(),
        FsConfig {
            prefetch_threads: 1,
            prefetch_blocks: 2,
            ..FsConfig::default()
        },
    );
    let fs = &fx.fs;
    let big = lookup(fs, ROOT, "big").ino;
    let want = noise(200_000, 7);
    let mut got = Vec::new();
    while got.len() < want.len() {
        got.extend(read_all(fs, big, got.len() as u64, 4096).unwrap());
    }
    assert_eq!(got, want);
}

#[test]
fn readdir_lists_dot_dotdot_and_entries_and_resumes_at_offsets() {
    let fx = fixture();
    let fs = &fx.fs;
    let whole = listing(fs, ROOT, usize::MAX);
    assert_eq!(
        names(&whole),
        [".", "..", "a", "big", "d", "h", "l", "null", "pipe"]
    );
    // The same, one entry a reply.
    assert_eq!(listing(fs, ROOT, 1), whole);
    let offsets: Vec<u64> = whole.iter().map(|e| e.1).collect();
    assert_eq!(offsets, (1..=9).collect::<Vec<u64>>());
    assert_eq!(whole[0].0, ROOT);
    assert_eq!(whole[2].0, lookup(fs, ROOT, "a").ino);
    assert_eq!(whole[4].2, FileType::Directory);
    assert_eq!(whole[6].2, FileType::Symlink);
    let d = lookup(fs, ROOT, "d").ino;
    let sub = listing(fs, d, 2);
    assert_eq!(names(&sub), [".", "..", "e", "x", "y"]);
    assert_eq!(sub[1].0, ROOT);
    // Past the end: nothing.
    let mut n = 0;
    fs.readdir(PID, d, 100, &mut |_, _, _, _| {
        n += 1;
        false
    })
    .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn a_large_directory_is_listed_in_batches() {
    let mut specs = vec![dir("")];
    let paths: Vec<&'static str> = (0..300)
        .map(|i| &*Box::leak(format!("f{i:03}").into_boxed_str()))
        .collect();
    specs.extend(paths.iter().map(|p| file(p, "x")));
    let fx = fixture_with(specs.clone(), FsConfig::default());
    let l = listing(&fx.fs, ROOT, 37);
    assert_eq!(l.len(), 302);
    assert_eq!(&names(&l)[2..], paths.as_slice());
    // With attributes (every entry, Always): batches of readdirplus.
    let fx = fixture_with(
        specs,
        FsConfig {
            readdirplus: Readdirplus::Always,
            ..FsConfig::default()
        },
    );
    let mut seen = Vec::new();
    fx.fs
        .readdirplus(PID, ROOT, 0, &mut |node, _, name, a| {
            seen.push((node, a.size, name.to_vec()));
            false
        })
        .unwrap();
    assert_eq!(seen.len(), 302);
    assert!(seen[2..].iter().all(|(n, size, _)| n.0 != 0 && *size == 1));
}

/// (node, name, kind, size) of a readdirplus listing of `ino`.
fn plus(fs: &SheafFs, ino: INodeNo) -> Vec<(u64, String, FileType, u64)> {
    let mut out = Vec::new();
    fs.readdirplus(PID, ino, 0, &mut |node, _, name, a| {
        out.push((
            node.0,
            String::from_utf8_lossy(name).into_owned(),
            a.kind,
            a.size,
        ));
        false
    })
    .unwrap();
    out
}

#[test]
fn readdirplus_gives_files_attributes_once_a_process_looks_them_up() {
    let fx = fixture();
    let fs = &fx.fs;
    let d = lookup(fs, ROOT, "d").ino;
    // Auto: directories with attributes, files by name until this process
    // has looked a file up in this directory.
    let before = plus(fs, d);
    let x = before.iter().find(|e| e.1 == "x").unwrap();
    assert_eq!(x.0, 0);
    let e = before.iter().find(|e| e.1 == "e").unwrap();
    assert_ne!(e.0, 0);
    assert_eq!(e.2, FileType::Directory);
    lookup(fs, d, "y");
    let after = plus(fs, d);
    let x = after.iter().find(|e| e.1 == "x").unwrap();
    assert_eq!((x.0 != 0, x.3), (true, 11));
    // A listing can stop early and resume.
    let mut first = Vec::new();
    fs.readdirplus(PID, d, 0, &mut |_, next, _, _| {
        first.push(next);
        true
    })
    .unwrap();
    assert_eq!(first, [1]);
    let mut rest = Vec::new();
    fs.readdirplus(PID, d, 1, &mut |_, next, name, _| {
        rest.push((next, name.to_vec()));
        next == 2
    })
    .unwrap();
    assert_eq!(rest, [(2, b"..".to_vec())]);
}

#[test]
fn readdirplus_always_and_never() {
    let fx = fixture_with(
        tree(),
        FsConfig {
            readdirplus: Readdirplus::Always,
            ..FsConfig::default()
        },
    );
    assert!(plus(&fx.fs, ROOT).iter().all(|e| e.0 != 0));
    let offered = InitFlags::all();
    let f = fx.fs.init_flags(offered);
    assert!(f.contains(InitFlags::FUSE_DO_READDIRPLUS));
    assert!(!f.contains(InitFlags::FUSE_READDIRPLUS_AUTO));
    assert!(f.contains(InitFlags::FUSE_PARALLEL_DIROPS | InitFlags::FUSE_CACHE_SYMLINKS));
    let never = serve(
        &fx.image,
        FsConfig {
            readdirplus: Readdirplus::Never,
            ..FsConfig::default()
        },
    );
    assert!(!never
        .init_flags(offered)
        .intersects(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO));
    assert!(fixture()
        .fs
        .init_flags(offered)
        .contains(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO));
    // Only what the kernel offers is asked for.
    assert_eq!(never.init_flags(InitFlags::empty()), InitFlags::empty());
}

#[test]
fn xattrs_are_read_and_listed() {
    let fx = fixture();
    let fs = &fx.fs;
    let d = lookup(fs, ROOT, "d").ino;
    let x = lookup(fs, d, "x").ino;
    assert_eq!(fs.getxattr(x, b"user.two").unwrap(), b"22");
    assert_eq!(fs.getxattr(x, b"user.three"), Err(Errno::NO_XATTR));
    assert_eq!(fs.listxattr(x).unwrap(), b"user.one\0user.two\0");
    let a = lookup(fs, ROOT, "a").ino;
    assert_eq!(fs.listxattr(a).unwrap(), b"");
    assert_eq!(fs.getxattr(a, b"user.one"), Err(Errno::NO_XATTR));
    assert_eq!(fs.listxattr(INodeNo(1 << 40)), Err(Errno::ENOENT));
    assert_eq!(
        fs.getxattr(INodeNo(1 << 40), b"user.one"),
        Err(Errno::ENOENT)
    );
    // The hidden statistics on the root, through getxattr too.
    let s = fs.getxattr(ROOT, crate::STATS_XATTR.as_bytes()).unwrap();
    let r: crate::stats::Report = serde_json::from_slice(&s).unwrap();
    assert_eq!(r.ops["getxattr"].count, 5);
}

#[test]
fn an_image_without_xattrs_answers_enosys() {
    let fx = fixture_with(vec![dir(""), file("a", "1")], FsConfig::default());
    let a = lookup(&fx.fs, ROOT, "a").ino;
    assert_eq!(fx.fs.getxattr(a, b"user.x"), Err(Errno::ENOSYS));
    assert_eq!(fx.fs.listxattr(a), Err(Errno::ENOSYS));
    // Statistics stay readable through the control ioctl.
    assert!(fx.fs.control(ROOT, crate::STATS_XATTR.as_bytes()).is_some());
}

#[test]
fn control_answers_statistics_and_pid_on_the_root_only() {
    let fx = fixture();
    let fs = &fx.fs;
    lookup(fs, ROOT, "a");
    let s = fs.control(ROOT, crate::STATS_XATTR.as_bytes()).unwrap();
    let r: crate::stats::Report = serde_json::from_slice(&s).unwrap();
    assert_eq!(r.pid, std::process::id());
    assert_eq!(r.image, fx.image.display().to_string());
    assert_eq!(r.roots.len(), 1);
    assert_eq!(r.ops["lookup"].count, 1);
    assert!(r.remote.is_none() && r.disk_cache.is_none());
    // The bytes are JSON with sorted keys, as `sheaf stats` has read them.
    let v: serde_json::Value = serde_json::from_slice(&s).unwrap();
    assert_eq!(v.to_string().as_bytes(), s.as_slice());
    let pid = fs.control(ROOT, crate::PID_XATTR.as_bytes()).unwrap();
    assert_eq!(pid, std::process::id().to_string().as_bytes());
    assert_eq!(fs.control(ROOT, b"user.other"), None);
    let a = lookup(fs, ROOT, "a").ino;
    assert_eq!(fs.control(a, crate::STATS_XATTR.as_bytes()), None);
}

#[test]
fn access_refuses_writes_and_open_is_left_to_the_kernel() {
    let fx = fixture();
    let fs = &fx.fs;
    let a = lookup(fs, ROOT, "a").ino;
    assert_eq!(fs.access(a, AccessFlags::R_OK), Ok(()));
    assert_eq!(fs.access(a, AccessFlags::W_OK), Err(Errno::EROFS));
    assert_eq!(fs.open(), Errno::ENOSYS);
    assert_eq!(fs.stats().ops()["open"].count, 1);
}

#[test]
fn statfs_counts_the_image() {
    let fx = fixture();
    let s = fx.fs.statfs();
    let len = std::fs::metadata(&fx.image).unwrap().len();
    assert_eq!(s.blocks, len.div_ceil(4096));
    assert_eq!(s.files, 10);
    assert_eq!((s.bsize, s.namelen), (4096, 255));
}

#[test]
fn owner_options_present_every_entry_as_theirs() {
    let fx = fixture_with(
        tree(),
        FsConfig {
            uid: Some(7),
            gid: Some(8),
            ..FsConfig::default()
        },
    );
    let a = lookup(&fx.fs, ROOT, "a");
    assert_eq!((a.uid, a.gid), (7, 8));
    assert_eq!(fx.fs.getattr(ROOT).unwrap().uid, 7);
}

#[test]
fn inode_numbers_map_both_ways() {
    let fx = fixture();
    let fs = &fx.fs;
    let root = fs.root();
    assert_eq!(fs.fuse_ino(root), ROOT);
    assert_eq!(fs.image_ino(ROOT), Ok(root));
    for i in 0..10u32 {
        assert_eq!(fs.image_ino(fs.fuse_ino(i)), Ok(i));
    }
}

#[test]
fn damaged_data_is_an_eio_counted_and_named() {
    let tmp = tempfile::tempdir().unwrap();
    let data = noise(50_000, 99);
    let image = image(
        tmp.path(),
        vec![dir(""), dir("sub"), file("sub/f", data.clone())],
    );
    // The noise is stored as it is: flip a byte of it in the image.
    let mut bytes = std::fs::read(&image).unwrap();
    let at = bytes
        .windows(64)
        .position(|w| w == &data[1000..1064])
        .expect("stored raw");
    bytes[at + 10] ^= 0xff;
    std::fs::write(&image, &bytes).unwrap();
    let fs = serve(&image, FsConfig::default());
    let sub = lookup(&fs, ROOT, "sub").ino;
    let f = lookup(&fs, sub, "f").ino;
    assert_eq!(read_all(&fs, f, 0, 4096), Err(Errno::EIO));
    assert_eq!(fs.stats().image_errors.load(Relaxed), 1);
    let r = fs.report();
    assert_eq!(r.image_errors, 1);
    assert_eq!(r.ops["read"].errors, 1);
    assert_eq!(r.recent_errors.len(), 1);
    assert_eq!(r.recent_errors[0].path.as_deref(), Some("/sub/f"));
    assert_eq!(r.recent_errors[0].op, "read");
}

#[test]
fn files_read_are_recorded_in_first_read_order() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = tmp.path().join("record");
    let fx = fixture_with(
        tree(),
        FsConfig {
            record: Some(rec.clone()),
            ..FsConfig::default()
        },
    );
    let fs = &fx.fs;
    let d = lookup(fs, ROOT, "d").ino;
    let x = lookup(fs, d, "x").ino;
    let a = lookup(fs, ROOT, "a").ino;
    read_all(fs, x, 0, 10).unwrap();
    read_all(fs, a, 0, 10).unwrap();
    read_all(fs, x, 5, 10).unwrap();
    fs.write_record();
    assert_eq!(std::fs::read_to_string(&rec).unwrap(), "d/x\na\n");
}

#[test]
fn device_numbers_use_the_kernel_encoding() {
    use super::encode_dev;
    assert_eq!(encode_dev(libc::makedev(1, 3)), 0x103);
    assert_eq!(
        encode_dev(libc::makedev(259, 0x12345)),
        0x12345 & 0xff | 259 << 8 | (0x12300 << 12)
    );
}
