//! Helpers shared by the integration tests: running the `sheaf` binary,
//! making fixture entries with exact attributes, and comparing two trees
//! attribute by attribute.
#![allow(dead_code)]

pub mod hostile;
pub mod oci;
mod scenario;
pub mod servers;

#[allow(unused_imports)] // each test binary uses its part
pub use scenario::{assert_tree_eq, mount, mount_cmd, Scenario};

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::{CString, OsStr, OsString};
use std::fs;
use std::io::{Read, Write};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Path of the binary under test.
pub fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_sheaf")
}

/// What one run of a command gave (spawned, or in-process: the testkit's).
pub use sheaf_testkit::Out;

/// A `sheaf` command with stdin closed (as in CI) and, for remote images,
/// a node cache of its own (tests that share one pass `--cache-dir`), so
/// tests neither see each other's objects nor fill /var/cache/sheaf.
pub fn cmd() -> Command {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let mut c = Command::new(bin());
    c.stdin(Stdio::null());
    c.env_remove("SOURCE_DATE_EPOCH");
    for v in [
        "SHEAF_PROXY",
        "http_proxy",
        "https_proxy",
        "HTTP_PROXY",
        "HTTPS_PROXY",
        "ALL_PROXY",
        "all_proxy",
    ] {
        c.env_remove(v);
    }
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
        "node-cache-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    c.env("SHEAF_CACHE_DIR", cache);
    c
}

/// Run a prepared command and collect its output.
pub fn run_cmd(c: &mut Command) -> Out {
    let what = format!("{c:?}");
    // A binary a test has just copied can be briefly "text file busy": a
    // child another test thread forked meanwhile holds the copy's write
    // descriptor until it execs. Retried, as cargo itself does.
    let mut tries = 0;
    let o = loop {
        match c.output() {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            r => break r.unwrap_or_else(|e| panic!("cannot run {what}: {e}")),
        }
    };
    let code = match o.status.code() {
        Some(c) => c,
        None => {
            use std::os::unix::process::ExitStatusExt;
            -o.status.signal().unwrap_or(0)
        }
    };
    Out {
        code,
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        what,
    }
}

/// Run `sheaf ARGS...`.
pub fn sheaf<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    run_cmd(cmd().args(args))
}

/// Run `sheaf ARGS...` in this process (`sheaf_testkit::sheaf`): for
/// commands whose logic and output a test checks, without a process of
/// their own (see its documentation for which).
pub fn sheaf_in<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    sheaf_testkit::sheaf(args)
}

/// `sheaf build SRC -o IMG EXTRA...` (in-process), asserting success.
#[track_caller]
pub fn build(src: &Path, img: &Path, extra: &[&str]) -> Out {
    let mut a: Vec<&OsStr> = vec![
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
    ];
    a.extend(extra.iter().map(OsStr::new));
    sheaf_in(a).ok()
}

/// `sheaf extract -p IMG -C DIR` (in-process), asserting success: every
/// attribute back, devices and setuid bits too, for round trips.
#[track_caller]
pub fn extract_preserving(img: &Path, dir: &Path) -> Out {
    sheaf_in([
        "extract".as_ref(),
        "-p".as_ref(),
        img.as_os_str(),
        "-C".as_ref(),
        dir.as_os_str(),
    ])
    .ok()
}

/// `sheaf extract IMG -C DIR` (in-process), asserting success.
#[track_caller]
pub fn extract(img: &Path, dir: &Path) -> Out {
    sheaf_in([
        "extract".as_ref(),
        img.as_os_str(),
        "-C".as_ref(),
        dir.as_os_str(),
    ])
    .ok()
}

pub fn is_root() -> bool {
    unsafe { libc::geteuid() == 0 }
}

/// A mount made by a test, taken down (lazily, errors ignored) when dropped,
/// so a failing test leaves no mount behind. The one guard every test uses.
pub struct Mounted {
    /// Where it is mounted.
    pub mp: PathBuf,
}

impl Mounted {
    /// Run a prepared `sheaf mount ...` command whose mount point is `mp`
    /// (created first), asserting success.
    #[track_caller]
    pub fn run(c: &mut Command, mp: &Path) -> Mounted {
        fs::create_dir_all(mp).unwrap();
        run_cmd(c).ok();
        Mounted::adopt(mp)
    }

    /// Guard a mount the test made at `mp`.
    pub fn adopt(mp: &Path) -> Mounted {
        Mounted {
            mp: mp.to_path_buf(),
        }
    }

    /// `sheaf stats --json` of the mount.
    pub fn stats(&self) -> serde_json::Value {
        json(&sheaf(["stats".as_ref(), "--json".as_ref(), self.mp.as_os_str()]).ok())
    }

    /// The serving process.
    pub fn pid(&self) -> i32 {
        self.stats()["pid"].as_i64().unwrap() as i32
    }

    /// Unmount now, asserting success.
    #[track_caller]
    pub fn umount(self) {
        sheaf(["umount".as_ref(), self.mp.as_os_str()]).ok();
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = cmd().arg("umount").arg("--lazy").arg(&self.mp).output();
    }
}

/// Whether anything is mounted at `mp` (by /proc/self/mountinfo).
pub fn is_mounted(mp: &Path) -> bool {
    let mp = mp.canonicalize().unwrap_or_else(|_| mp.to_path_buf());
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().any(|l| {
        l.split(' ')
            .nth(4)
            .is_some_and(|m| m.replace("\\040", " ") == mp.to_string_lossy())
    })
}

/// Whether this run is the fast tier (`make check`: no root, no servers, no
/// mounts, no real trees).
pub fn check_tier() -> bool {
    std::env::var("SHEAF_TEST_TIER").as_deref() == Ok("check")
}

/// Whether a test's prerequisite is met. In the fast tier a test without it
/// is skipped, saying so; anywhere else (`make test`, CI) a missing
/// prerequisite fails the test instead of letting it pass unseen.
#[track_caller]
pub fn prerequisite(ok: bool, what: &str) -> bool {
    if ok {
        return true;
    }
    if check_tier() {
        eprintln!("skipped in the check tier: needs {what}");
        return false;
    }
    panic!("prerequisite missing: {what} (`make test` provides it; `make check` skips this test)");
}

/// Whether this test may mount real FUSE filesystems (not in the fast tier).
#[track_caller]
pub fn mounts_allowed() -> bool {
    prerequisite(!check_tier(), "real FUSE mounts")
}

/// A real tree (K, P) prepared by `make trees` under `$SHEAF_BENCH_DATA`.
#[track_caller]
pub fn real_tree(name: &str) -> Option<PathBuf> {
    let data = std::env::var_os("SHEAF_BENCH_DATA").filter(|_| !check_tier());
    if !prerequisite(data.is_some(), &format!("tree {name} (SHEAF_BENCH_DATA)")) {
        return None;
    }
    let p = PathBuf::from(data.expect("checked")).join(name);
    assert!(
        p.is_dir(),
        "{} missing: run bench/setup.sh {name}",
        p.display()
    );
    Some(p)
}

/// A temporary directory on the ordinary filesystem (/tmp: sparse files,
/// xattrs and ACLs work there).
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("sheaf-it-")
        .tempdir()
        .expect("tempdir")
}

/// Deterministic pseudo-random bytes (xorshift64*), so fixtures are reproducible.
pub struct Rng(pub u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    pub fn fill(&mut self, buf: &mut [u8]) {
        for c in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            c.copy_from_slice(&v[..c.len()]);
        }
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0; n];
        self.fill(&mut v);
        v
    }
    /// Compressible text-like bytes.
    pub fn text(&mut self, n: usize) -> Vec<u8> {
        const WORDS: &[&str] = &[
            "alpha ", "beta ", "gamma ", "delta\n", "sheaf ", "block ", "42 ", "page ",
        ];
        let mut v = Vec::with_capacity(n + 8);
        while v.len() < n {
            v.extend_from_slice(WORDS[self.below(WORDS.len() as u64) as usize].as_bytes());
        }
        v.truncate(n);
        v
    }
}

pub fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("no NUL in path")
}

pub fn write(p: &Path, data: &[u8]) {
    fs::write(p, data).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
}

pub fn chmod(p: &Path, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {}: {e}", p.display()));
}

/// Set the mtime (and atime) of `p` without following a symlink.
pub fn set_mtime(p: &Path, sec: i64, nsec: u32) {
    let t = libc::timespec {
        tv_sec: sec as libc::time_t,
        tv_nsec: nsec as libc::c_long,
    };
    let c = cstr(p);
    let rc = unsafe {
        libc::utimensat(
            libc::AT_FDCWD,
            c.as_ptr(),
            [t, t].as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    assert_eq!(
        rc,
        0,
        "utimensat {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

pub fn lchown(p: &Path, uid: u32, gid: u32) {
    let c = cstr(p);
    let rc = unsafe { libc::lchown(c.as_ptr(), uid, gid) };
    assert_eq!(
        rc,
        0,
        "lchown {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

pub fn mknod(p: &Path, mode: u32, dev: u64) -> std::io::Result<()> {
    let c = cstr(p);
    if unsafe { libc::mknod(c.as_ptr(), mode, dev as libc::dev_t) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

pub fn symlink(target: &[u8], p: &Path) {
    std::os::unix::fs::symlink(OsStr::from_bytes(target), p)
        .unwrap_or_else(|e| panic!("symlink {}: {e}", p.display()));
}

/// Join a relative byte path to a root.
pub fn join(root: &Path, rel: &[u8]) -> PathBuf {
    if rel.is_empty() {
        root.to_path_buf()
    } else {
        root.join(OsStr::from_bytes(rel))
    }
}

pub fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Every entry under `root` (not following symlinks) as relative byte paths,
/// sorted; the root itself is the empty path.
pub fn walk(root: &Path) -> Vec<Vec<u8>> {
    let mut out = vec![Vec::new()];
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(rel) = stack.pop() {
        let dir = join(root, &rel);
        let mut names: Vec<OsString> = fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
            .map(|e| e.expect("dirent").file_name())
            .collect();
        names.sort();
        for n in names {
            let mut p = rel.clone();
            if !p.is_empty() {
                p.push(b'/');
            }
            p.extend_from_slice(n.as_bytes());
            let md = fs::symlink_metadata(join(root, &p)).expect("lstat");
            if md.file_type().is_dir() {
                stack.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

/// All xattrs of a path (not following symlinks), by name.
pub fn xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let mut m = BTreeMap::new();
    let names = match xattr::list(p) {
        Ok(n) => n,
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return m,
        Err(e) => panic!("listxattr {}: {e}", p.display()),
    };
    for n in names {
        if let Some(v) =
            xattr::get(p, &n).unwrap_or_else(|e| panic!("getxattr {}: {e}", p.display()))
        {
            m.insert(n.into_vec(), v);
        }
    }
    m
}

/// Compare two files' bytes by streaming them; `Err` describes the first difference.
pub fn same_content(a: &Path, b: &Path) -> Result<(), String> {
    let mut fa = fs::File::open(a).map_err(|e| format!("{}: {e}", a.display()))?;
    let mut fb = fs::File::open(b).map_err(|e| format!("{}: {e}", b.display()))?;
    same_stream(&mut fa, &mut fb)
}

/// Compare two readers to their end.
pub fn same_stream(a: &mut dyn Read, b: &mut dyn Read) -> Result<(), String> {
    let mut ba = vec![0u8; 1 << 20];
    let mut bb = vec![0u8; 1 << 20];
    let mut off = 0u64;
    loop {
        let na = read_full(a, &mut ba).map_err(|e| e.to_string())?;
        let nb = read_full(b, &mut bb).map_err(|e| e.to_string())?;
        if ba[..na] != bb[..nb] {
            let i = ba[..na]
                .iter()
                .zip(&bb[..nb])
                .position(|(x, y)| x != y)
                .unwrap_or(na.min(nb));
            return Err(format!(
                "contents differ at byte {} (lengths of this window {na} vs {nb})",
                off + i as u64
            ));
        }
        if na == 0 {
            return Ok(());
        }
        off += na as u64;
    }
}

pub fn read_full(r: &mut dyn Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match r.read(&mut buf[n..])? {
            0 => break,
            k => n += k,
        }
    }
    Ok(n)
}

/// What [`compare_trees`] compares besides types, permission bits, sizes,
/// symlink targets and file contents (always compared).
#[derive(Debug, Clone, Copy)]
pub struct Cmp {
    pub owner: bool,
    /// Compare mtime seconds.
    pub mtime: bool,
    /// Also compare mtime nanoseconds.
    pub nsec: bool,
    /// Compare mtimes of directories too.
    pub dir_mtime: bool,
    pub xattrs: bool,
    pub nlink: bool,
    pub rdev: bool,
    /// Compare the attributes of the two roots themselves.
    pub root: bool,
    /// Check that paths share an inode in one tree exactly when they do in the other.
    pub hardlinks: bool,
}

impl Cmp {
    /// Everything.
    pub fn all() -> Self {
        Cmp {
            owner: true,
            mtime: true,
            nsec: true,
            dir_mtime: true,
            xattrs: true,
            nlink: true,
            rdev: true,
            root: true,
            hardlinks: true,
        }
    }
}

/// Compare two trees entry by entry; returns every difference found.
pub fn compare_trees(a: &Path, b: &Path, cmp: Cmp) -> Vec<String> {
    let mut errs = Vec::new();
    let pa = walk(a);
    let pb = walk(b);
    let sa: BTreeSet<_> = pa.iter().cloned().collect();
    let sb: BTreeSet<_> = pb.iter().cloned().collect();
    for p in sa.difference(&sb) {
        errs.push(format!("{:?}: missing from {}", lossy(p), b.display()));
    }
    for p in sb.difference(&sa) {
        errs.push(format!("{:?}: unexpected in {}", lossy(p), b.display()));
    }
    // inode in a -> (inode in b, first path); and the reverse.
    let mut a2b: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    let mut b2a: HashMap<u64, (u64, Vec<u8>)> = HashMap::new();
    for p in sa.intersection(&sb) {
        let (x, y) = (join(a, p), join(b, p));
        let (ma, mb) = (
            fs::symlink_metadata(&x).expect("lstat a"),
            fs::symlink_metadata(&y).expect("lstat b"),
        );
        let name = format!("{:?}", lossy(p));
        let mut diff = |what: &str, va: String, vb: String| {
            if va != vb {
                errs.push(format!("{name}: {what}: {va} (source) vs {vb} (copy)"));
            }
        };
        let ifmt = |m: u32| m & libc::S_IFMT;
        diff(
            "type",
            format!("{:o}", ifmt(ma.mode())),
            format!("{:o}", ifmt(mb.mode())),
        );
        if ifmt(ma.mode()) != ifmt(mb.mode()) {
            continue;
        }
        let is_root = p.is_empty();
        let is_dir = ma.is_dir();
        let is_link = ma.file_type().is_symlink();
        if is_root && !cmp.root {
            continue;
        }
        if !is_link {
            diff(
                "mode",
                format!("{:04o}", ma.mode() & 0o7777),
                format!("{:04o}", mb.mode() & 0o7777),
            );
        }
        if cmp.owner {
            diff("uid", ma.uid().to_string(), mb.uid().to_string());
            diff("gid", ma.gid().to_string(), mb.gid().to_string());
        }
        if !is_dir {
            diff("size", ma.size().to_string(), mb.size().to_string());
        }
        if cmp.mtime && (!is_dir || cmp.dir_mtime) {
            diff("mtime sec", ma.mtime().to_string(), mb.mtime().to_string());
            if cmp.nsec {
                diff(
                    "mtime nsec",
                    ma.mtime_nsec().to_string(),
                    mb.mtime_nsec().to_string(),
                );
            }
        }
        if cmp.nlink {
            diff("nlink", ma.nlink().to_string(), mb.nlink().to_string());
        }
        if cmp.rdev && matches!(ifmt(ma.mode()), libc::S_IFCHR | libc::S_IFBLK) {
            diff(
                "rdev",
                format!("{:#x}", ma.rdev()),
                format!("{:#x}", mb.rdev()),
            );
        }
        if is_link {
            let ta = fs::read_link(&x).expect("readlink a");
            let tb = fs::read_link(&y).expect("readlink b");
            diff("symlink target", format!("{ta:?}"), format!("{tb:?}"));
        }
        if cmp.xattrs {
            diff(
                "xattrs",
                format!("{:?}", xattrs(&x)),
                format!("{:?}", xattrs(&y)),
            );
        }
        if ma.is_file() && ma.size() == mb.size() {
            if let Err(e) = same_content(&x, &y) {
                errs.push(format!("{name}: {e}"));
            }
        }
        if cmp.hardlinks && !is_dir {
            let (ia, ib) = (ma.ino(), mb.ino());
            match a2b.get(&ia) {
                Some((jb, first)) if *jb != ib => errs.push(format!(
                    "{name}: shares an inode with {:?} in the source but not in the copy",
                    lossy(first)
                )),
                None => {
                    a2b.insert(ia, (ib, p.clone()));
                }
                _ => {}
            }
            match b2a.get(&ib) {
                Some((ja, first)) if *ja != ia => errs.push(format!(
                    "{name}: shares an inode with {:?} in the copy but not in the source",
                    lossy(first)
                )),
                None => {
                    b2a.insert(ib, (ia, p.clone()));
                }
                _ => {}
            }
        }
    }
    errs
}

/// `diff -r --no-dereference A B` (GNU diffutils, independent of sheaf)
/// finds no difference.
#[track_caller]
pub fn assert_diff_r(a: &Path, b: &Path) {
    let d = Command::new("diff")
        .arg("-r")
        .arg("--no-dereference")
        .arg(a)
        .arg(b)
        .output()
        .unwrap();
    assert!(
        d.status.success(),
        "diff -r: {}",
        String::from_utf8_lossy(&d.stdout)
    );
}

#[track_caller]
pub fn assert_same_tree(a: &Path, b: &Path, cmp: Cmp) {
    let errs = compare_trees(a, b, cmp);
    assert!(
        errs.is_empty(),
        "{} differences between {} and {}:\n  {}",
        errs.len(),
        a.display(),
        b.display(),
        errs.iter()
            .take(60)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
}

/// Set every entry's mtime under `root` (root included) from `f(index, path)`,
/// after the tree is complete (so directory mtimes stay as set).
pub fn set_all_mtimes(root: &Path, mut f: impl FnMut(usize, &[u8]) -> (i64, u32)) {
    for (i, p) in walk(root).iter().enumerate() {
        let (s, n) = f(i, p);
        set_mtime(&join(root, p), s, n);
    }
}

/// Build a small tree of ordinary entries: nested dirs, text and random
/// files, a multi-block file, a symlink, a hardlink, duplicates.
pub fn small_tree(root: &Path, seed: u64) {
    let mut r = Rng::new(seed);
    fs::create_dir_all(root.join("docs/deep/er")).unwrap();
    fs::create_dir_all(root.join("bin")).unwrap();
    fs::create_dir(root.join("empty")).unwrap();
    write(&root.join("README.txt"), &r.text(5000));
    write(&root.join("docs/a.txt"), &r.text(70_000));
    write(&root.join("docs/b.txt"), &r.text(123));
    write(
        &root.join("docs/copy-of-b.txt"),
        &fs::read(root.join("docs/b.txt")).unwrap(),
    );
    write(&root.join("docs/deep/er/leaf.md"), b"leaf\n");
    write(&root.join("docs/empty.txt"), b"");
    let big = {
        let mut v = r.bytes(300_000);
        v.extend(r.text(400_000));
        v
    };
    write(&root.join("bin/tool"), &big);
    chmod(&root.join("bin/tool"), 0o755);
    write(&root.join("bin/random.dat"), &r.bytes(90_001));
    fs::hard_link(root.join("bin/tool"), root.join("bin/tool-link")).unwrap();
    symlink(b"../README.txt", &root.join("docs/readme-link"));
    chmod(&root.join("docs"), 0o750);
    set_all_mtimes(root, |i, _| {
        (
            1_650_000_000 + i as i64 * 3,
            (i as u32 * 7_654_321) % 1_000_000_000,
        )
    });
}

/// `ls -l`-style mode string, as `sheaf ls -l` prints it.
pub fn mode_string(mode: u32) -> String {
    let t = match mode & libc::S_IFMT {
        libc::S_IFDIR => 'd',
        libc::S_IFLNK => 'l',
        libc::S_IFCHR => 'c',
        libc::S_IFBLK => 'b',
        libc::S_IFIFO => 'p',
        libc::S_IFSOCK => 's',
        _ => '-',
    };
    let mut s = String::from(t);
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        let on = mode & (1 << (8 - i)) != 0;
        let special = match i {
            2 => mode & 0o4000 != 0,
            5 => mode & 0o2000 != 0,
            8 => mode & 0o1000 != 0,
            _ => false,
        };
        s.push(match (on, special) {
            (true, false) => c,
            (false, false) => '-',
            (true, true) => {
                if i == 8 {
                    't'
                } else {
                    's'
                }
            }
            (false, true) => {
                if i == 8 {
                    'T'
                } else {
                    'S'
                }
            }
        });
    }
    s
}

/// Files in `dir` whose name looks like a build temporary.
pub fn temp_leftovers(dir: &Path) -> Vec<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".sheaf-tmp."))
        .collect()
}

/// Parse stdout as JSON.
#[track_caller]
pub fn json(o: &Out) -> serde_json::Value {
    serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{}: stdout is not JSON ({e}):\n{}", o.what, o.describe()))
}

/// Write `data` to a child's stdin from a thread and collect its output.
pub fn run_with_stdin(c: &mut Command, data: Vec<u8>) -> Out {
    let what = format!("{c:?}");
    let mut child = c
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let mut stdin = child.stdin.take().unwrap();
    let t = std::thread::spawn(move || {
        let _ = stdin.write_all(&data);
    });
    let o = child.wait_with_output().expect("wait");
    t.join().unwrap();
    Out {
        code: o.status.code().unwrap_or(-1),
        stdout: o.stdout,
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        what,
    }
}

/// The distinct objects (pages and blocks) of an image as (digest, stored
/// length), listed by the reader library, independently of bcast.
pub fn image_objects(img: &Path) -> Vec<([u8; 32], u64)> {
    let src = sheaf_read::FileSource::open(img).unwrap();
    let img = sheaf_read::Image::open(std::sync::Arc::new(src)).unwrap();
    let mut seen = std::collections::HashSet::new();
    img.object_refs()
        .unwrap()
        .into_iter()
        .filter(|(r, _)| seen.insert(r.offset))
        .map(|(r, _)| (r.hash, r.clen as u64))
        .collect()
}

/// Stored bytes of the objects of `new` that `old` lacks, and of all of
/// `new`'s objects.
pub fn new_object_bytes(old: &Path, new: &Path) -> (u64, u64) {
    let have: std::collections::HashSet<[u8; 32]> =
        image_objects(old).into_iter().map(|o| o.0).collect();
    let all = image_objects(new);
    let total = all.iter().map(|o| o.1).sum();
    let fresh = all
        .iter()
        .filter(|o| !have.contains(&o.0))
        .map(|o| o.1)
        .sum();
    (fresh, total)
}

/// A new ed25519 key pair made by OpenSSH's ssh-keygen at `dir/key`, and
/// `dir/signers`, an allowed_signers file trusting it as principal `ci`:
/// (private key, signers file).
pub fn ssh_signer(dir: &Path) -> (PathBuf, PathBuf) {
    let key = dir.join("key");
    run_cmd(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key),
    )
    .ok();
    let signers = dir.join("signers");
    fs::write(
        &signers,
        format!(
            "ci {}",
            fs::read_to_string(key.with_extension("pub")).unwrap()
        ),
    )
    .unwrap();
    (key, signers)
}

/// `sheaf ls -R`'s output (GNU ls -R's sections: `DIR:`, the entries of
/// DIR, a blank line between sections) as (DIR, entry lines) pairs.
pub fn ls_sections(text: &str) -> Vec<(String, Vec<String>)> {
    text.trim_end_matches('\n')
        .split("\n\n")
        .map(|s| {
            let mut l = s.lines();
            let h = l.next().unwrap_or_default();
            let h = h
                .strip_suffix(':')
                .unwrap_or_else(|| panic!("not a section: {s:?}"));
            (h.to_string(), l.map(String::from).collect())
        })
        .collect()
}

/// The paths `sheaf ls -R` (without -l) lists, relative to the directory
/// listed, one a line, in its order: its sections' names joined to their
/// directories.
pub fn ls_r_paths(text: &str) -> String {
    let sections = ls_sections(text);
    let root = sections.first().map(|s| s.0.clone()).unwrap_or_default();
    let mut out = String::new();
    for (dir, names) in &sections {
        let rel = dir.strip_prefix(root.as_str()).unwrap_or(dir);
        let rel = rel.trim_start_matches('/');
        for n in names {
            if !rel.is_empty() {
                out.push_str(rel);
                out.push('/');
            }
            out.push_str(n);
            out.push('\n');
        }
    }
    out
}

/// The command lines of a Markdown `sh` block's text: continuation lines
/// (ending in `\\`) joined, blank and comment-only lines dropped.
pub fn sh_lines<'a>(block: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut lines = Vec::new();
    let mut pending = String::new();
    for l in block {
        let l = l.trim();
        if let Some(c) = l.strip_suffix('\\') {
            pending.push_str(c);
            continue;
        }
        let full = format!("{pending}{l}");
        pending.clear();
        if !full.is_empty() && !full.starts_with('#') {
            lines.push(full);
        }
    }
    lines
}
