//! `sheaf mount --kernel`: the kernel's EROFS driver serves the tree from
//! the metadata image sheaf writes, sheaf serves the data (docs/mount.md,
//! "The kernel path"). What the mount shows is compared with the source
//! tree through the kernel on both sides, independently of sheaf; the
//! fallback to FUSE, the reuse of the metadata image, the end of the server
//! with the mount and the mount with the server are each checked.

mod common;

use common::*;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The filesystem type mounted at `mp` (/proc/self/mountinfo).
fn fstype(mp: &Path) -> Option<String> {
    let mp = mp.canonicalize().unwrap();
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (left.split(' ').nth(4)? == mp.to_str()?)
            .then(|| right.split(' ').next().unwrap_or("").to_string())
    })
}

/// Live processes whose command line names `mp` (the mount's server and
/// its watchdog).
fn servers_of(mp: &Path) -> Vec<i32> {
    let needle = mp.as_os_str().as_encoded_bytes().to_vec();
    fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
                c.split(|&b| b == 0).any(|a| a == needle.as_slice())
                    && c.split(|&b| b == 0).any(|a| a == b"mount")
            })
        })
        .collect()
}

#[track_caller]
fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let t = Instant::now();
    while !ok() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "{what}: not within 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn kernel_args(cache: &Path, when: &str) -> Vec<String> {
    vec![
        format!("--kernel={when}"),
        "-o".into(),
        format!("kernel_cache={}", cache.display()),
    ]
}

fn refs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// A tree for the writer's corners: a directory of several blocks of
/// entries, a name of 255 bytes, owners past 16 bits, a device, a FIFO,
/// extended attributes, files of exactly one block and of none, half the
/// entries sharing one time (compact inodes) and half not (extended).
fn corners(root: &Path) {
    small_tree(root, 11);
    let many = root.join("many");
    fs::create_dir(&many).unwrap();
    for i in 0..3000 {
        write(&many.join(format!("entry-with-a-name-{i:05}")), b"");
    }
    write(&root.join("n".repeat(255)), b"long name\n");
    write(&root.join("block"), &patterned(4096));
    write(&root.join("owned"), b"owned\n");
    lchown(&root.join("owned"), 70_000, 70_001);
    mknod(
        &root.join("null"),
        libc::S_IFCHR | 0o644,
        libc::makedev(1, 3),
    )
    .unwrap();
    mknod(&root.join("fifo"), libc::S_IFIFO | 0o600, 0).unwrap();
    xattr::set(root.join("block"), "user.note", b"a value").unwrap();
    xattr::set(root.join("many"), "trusted.t", b"").unwrap();
    set_all_mtimes(root, |i, _| {
        if i % 2 == 0 {
            (1_700_000_000, 5)
        } else {
            (1_600_000_000 + i as i64, i as u32 * 977)
        }
    });
}

fn patterned(n: usize) -> Vec<u8> {
    (0..n).map(|i| (i * 31 % 251) as u8).collect()
}

#[test]
fn a_kernel_mount_shows_the_tree_exact_and_ends_with_its_server() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let sc = Scenario::new(corners).build(&[]);
    let cache = sc.dir().join("kcache");
    let args = kernel_args(&cache, "require");
    let m = sc.mount(&refs(&args));
    assert_eq!(fstype(&sc.mp).as_deref(), Some("erofs"));
    assert_tree_eq(&sc.mp, &sc.src);
    // The metadata image is root's alone.
    let meta: Vec<PathBuf> = fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "erofs"))
        .collect();
    assert_eq!(meta.len(), 1, "{meta:?}");
    assert_eq!(fs::metadata(&cache).unwrap().mode() & 0o777, 0o700);
    let ino = fs::metadata(&meta[0]).unwrap().ino();
    assert!(!servers_of(&sc.mp).is_empty());
    // No statistics to show: said as such, in one line.
    let o = sheaf(["stats".as_ref(), sc.mp.as_os_str()]).fails_with(1);
    assert!(
        o.one_err_line().ends_with(
            "a kernel-path mount (sheaf mount --kernel): the kernel's EROFS serves it and sheaf keeps no statistics for it"
        ),
        "{}",
        o.describe()
    );
    m.umount();
    assert!(!is_mounted(&sc.mp));
    wait_until("the server exits after umount", || {
        servers_of(&sc.mp).is_empty()
    });

    // A second mount uses the same metadata image, not a new one; --json
    // says what serves it.
    let mut with_json = args.clone();
    with_json.push("--json".into());
    let o = run_cmd(&mut sc.mount_cmd(&refs(&with_json))).ok();
    let m = Mounted::adopt(&sc.mp);
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["kernel"], true, "{v}");
    let root = sheaf_in(["root".as_ref(), sc.img.as_os_str()]).ok().text();
    let hex = root.trim().rsplit(':').next().unwrap().to_string();
    assert_eq!(v["roots"], serde_json::json!([hex]));
    assert!(
        servers_of(&sc.mp).contains(&(v["pid"].as_i64().unwrap() as i32)),
        "{v}"
    );
    assert_eq!(fs::metadata(&meta[0]).unwrap().ino(), ino);
    assert_eq!(
        fs::read_dir(&cache).unwrap().count(),
        2,
        "image and map only"
    );
    assert_eq!(
        fs::read(sc.mp.join("block")).unwrap(),
        fs::read(sc.src.join("block")).unwrap()
    );
    // A server killed outright takes its mount with it (its watchdog,
    // spared here, detaches it).
    let pids: Vec<i32> = servers_of(&sc.mp)
        .into_iter()
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() != "sheaf-watchdog")
        })
        .collect();
    assert_eq!(pids.len(), 1, "one server: {pids:?}");
    for &pid in &pids {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    wait_until("the mount goes with its killed server", || {
        !is_mounted(&sc.mp)
    });
    drop(m);
}

#[test]
fn where_the_kernel_path_cannot_be_taken_fuse_serves_and_says_why_in_one_line() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let sc = Scenario::new(|root| small_tree(root, 2)).build(&[]);
    let cache = sc.dir().join("kcache");
    let mp = sc.mp.display().to_string();
    // A writable overlay is the union's.
    let upper = sc.dir().join("upper");
    fs::create_dir(&upper).unwrap();
    let mut auto = kernel_args(&cache, "auto");
    let mut with_upper = auto.clone();
    with_upper.extend(["--upper".into(), upper.display().to_string()]);
    let o = run_cmd(&mut sc.mount_cmd(&refs(&with_upper))).ok();
    let _m = Mounted::adopt(&sc.mp);
    assert_eq!(
        o.one_err_line(),
        format!("sheaf: {mp}: served through FUSE: a writable overlay is served by sheaf's union")
    );
    assert_eq!(fstype(&sc.mp).as_deref(), Some("fuse.sheaf"));
    sheaf(["umount".as_ref(), sc.mp.as_os_str()]).ok();
    // uid= is FUSE's.
    let mut with_uid = std::mem::take(&mut auto);
    with_uid.extend(["-o".into(), "uid=1234".into()]);
    let o = run_cmd(&mut sc.mount_cmd(&refs(&with_uid))).ok();
    assert_eq!(
        o.one_err_line(),
        format!(
            "sheaf: {mp}: served through FUSE: uid= and gid= are FUSE's; the kernel shows the image's owners"
        )
    );
    assert_eq!(fs::metadata(sc.mp.join("README.txt")).unwrap().uid(), 1234);
    sheaf(["umount".as_ref(), sc.mp.as_os_str()]).ok();
    // kernel=require: the same reasons are refusals, and nothing is mounted.
    let mut req = kernel_args(&cache, "require");
    req.extend(["-o".into(), "uid=1234".into()]);
    let o = run_cmd(&mut sc.mount_cmd(&refs(&req))).fails_with(1);
    assert_eq!(
        o.one_err_line(),
        format!(
            "sheaf: error: {mp}: kernel=require, but uid= and gid= are FUSE's; the kernel shows the image's owners"
        )
    );
    assert!(!is_mounted(&sc.mp));
}

/// A device number past the kernel's 32-bit encoding (major 4096 and up)
/// is one thing the metadata writer cannot say: the mount is FUSE's, with
/// the reason.
#[test]
fn an_image_erofs_cannot_express_is_served_by_fuse_with_the_writers_reason() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    // Linux itself makes no such device (mknod refuses it): a tar does.
    let sc = Scenario::new(|root| write(&root.join("file"), b"file\n"));
    let tar_path = sc.dir().join("layer.tar");
    let mut t = tar::Builder::new(fs::File::create(&tar_path).unwrap());
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Char);
    h.set_path("dev").unwrap();
    h.set_mode(0o600);
    h.set_size(0);
    h.set_device_major(5000).unwrap();
    h.set_device_minor(1).unwrap();
    h.set_cksum();
    t.append(&h, std::io::empty()).unwrap();
    t.finish().unwrap();
    drop(t);
    sheaf([
        "build".as_ref(),
        tar_path.as_os_str(),
        "-o".as_ref(),
        sc.img.as_os_str(),
    ])
    .ok();
    let cache = sc.dir().join("kcache");
    let o = run_cmd(&mut sc.mount_cmd(&refs(&kernel_args(&cache, "auto")))).ok();
    let _m = Mounted::adopt(&sc.mp);
    assert_eq!(
        o.one_err_line(),
        format!(
            "sheaf: {}: served through FUSE: EROFS cannot express device 5000:1",
            sc.mp.display()
        )
    );
    assert_eq!(fstype(&sc.mp).as_deref(), Some("fuse.sheaf"));
    assert!(fs::symlink_metadata(sc.mp.join("dev"))
        .unwrap()
        .file_type()
        .is_char_device());
    // Nothing half-written is left to be taken for a metadata image.
    let left: Vec<_> = fs::read_dir(&cache).unwrap().collect();
    assert!(left.is_empty(), "{left:?}");
}

/// The kernel reads what sheaf serves: a data block that fails
/// verification is EIO through the kernel mount, never other bytes.
#[test]
fn a_damaged_data_block_is_eio_through_the_kernel_never_wrong_bytes() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let data: Vec<u8> = {
        let mut r = Rng::new(5);
        r.bytes(4 << 20)
    };
    let sc = Scenario::new(|root| write(&root.join("data"), &data)).build(&[
        "-c",
        "none",
        "--block-size",
        "64K",
    ]);
    let mut img = fs::read(&sc.img).unwrap();
    // 1 MiB in: inside the file's data (4 MiB of it in 64 KiB blocks,
    // stored as is, before the metadata).
    img[1 << 20] ^= 0x55;
    fs::write(&sc.img, &img).unwrap();
    let cache = sc.dir().join("kcache");
    let _m = sc.mount(&refs(&kernel_args(&cache, "require")));
    assert_eq!(fstype(&sc.mp).as_deref(), Some("erofs"));
    let e = fs::read(sc.mp.join("data")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Every 64 KiB piece that does read is the source's.
    let f = fs::File::open(sc.mp.join("data")).unwrap();
    let mut good = 0;
    for (i, want) in data.chunks(64 << 10).enumerate() {
        let mut got = vec![0u8; want.len()];
        use std::os::unix::fs::FileExt;
        if f.read_exact_at(&mut got, (i * (64 << 10)) as u64).is_ok() {
            assert_eq!(&got, want, "piece {i}");
            good += 1;
        }
    }
    // All but the damaged block and what the kernel read ahead with it.
    assert!(good >= 48, "only {good} of 64 pieces read");
}

#[test]
fn tree_k_compares_exact_through_the_kernel_mount() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let Some(src) = real_tree("K") else { return };
    let sc = Scenario::of(&src).image_name("K.sheaf").build(&[]);
    let cache = sc.dir().join("kcache");
    let _m = sc.mount(&refs(&kernel_args(&cache, "require")));
    assert_eq!(fstype(&sc.mp).as_deref(), Some("erofs"));
    assert_tree_eq(&sc.mp, &src);
    assert_diff_r(&src, &sc.mp);
}

/// `sheaf cache gc --kernel --kernel-cache CACHE --older-than AGE [--json]`.
fn kernel_gc_run(cache: &Path, older_than: &str, json: bool) -> Out {
    let mut args: Vec<&std::ffi::OsStr> = vec![
        "cache".as_ref(),
        "gc".as_ref(),
        "--kernel".as_ref(),
        "--kernel-cache".as_ref(),
        cache.as_os_str(),
        "--older-than".as_ref(),
        older_than.as_ref(),
    ];
    if json {
        args.push("--json".as_ref());
    }
    sheaf(args)
}

/// `sheaf cache gc --kernel`'s JSON report.
fn kernel_gc(cache: &Path, older_than: &str) -> serde_json::Value {
    let o = kernel_gc_run(cache, older_than, true).ok();
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Set `path`'s modification time `secs` seconds into the past (touch(1),
/// not sheaf).
fn age_by(path: &Path, secs: u64) {
    run_cmd(
        std::process::Command::new("touch")
            .arg("-m")
            .arg("-d")
            .arg(format!("@{}", now_secs() - secs))
            .arg(path),
    )
    .ok();
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn names_in(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn the_kernel_cache_keeps_what_mounts_use_and_collects_the_rest() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let sc = Scenario::new(|root| {
        write(&root.join("a"), &patterned(300_000));
        write(&root.join("b"), &patterned(70_000));
    })
    .build(&[]);
    let cache = sc.dir().join("kcache");
    let args = kernel_args(&cache, "require");
    let m = sc.mount(&refs(&args));
    let meta: Vec<String> = names_in(&cache)
        .into_iter()
        .filter(|n| n.ends_with(".erofs"))
        .collect();
    assert_eq!(meta.len(), 1, "{:?}", names_in(&cache));
    let meta = cache.join(&meta[0]);
    let map = meta.with_extension("map");
    assert!(map.exists());
    // Recently used: kept by the default age (30 days).
    let r = kernel_gc(&cache, "30d");
    assert_eq!(
        (r["removed"].as_u64(), r["kept"].as_u64()),
        (Some(0), Some(1)),
        "{r}"
    );
    // Leftovers: a killed writer's temporary over an hour old and a blob
    // map without its image go; a temporary being written now stays.
    let old_tmp = cache.join(".meta0123456789abcdef.tmp");
    let new_tmp = cache.join(".sheaf-tmp-0123456789abcdef");
    let orphan = cache.join(format!("{}.v1.map", "ab".repeat(32)));
    for p in [&old_tmp, &new_tmp, &orphan] {
        write(p, b"left");
    }
    age_by(&old_tmp, 7200);
    age_by(&orphan, 7200);
    // Everything, while the mount uses it: the mount keeps its bytes (the
    // kernel holds the metadata image open until it is unmounted).
    let r = kernel_gc(&cache, "0");
    assert_eq!(
        (
            r["removed"].as_u64(),
            r["leftovers"].as_u64(),
            r["kept"].as_u64()
        ),
        (Some(1), Some(2), Some(0)),
        "{r}"
    );
    assert_eq!(
        names_in(&cache),
        [".sheaf-tmp-0123456789abcdef"],
        "only the fresh temporary left"
    );
    assert_eq!(
        fs::read(sc.mp.join("b")).unwrap(),
        fs::read(sc.src.join("b")).unwrap()
    );
    assert_tree_eq(&sc.mp, &sc.src);
    m.umount();
    // The next mount writes it again.
    let m = sc.mount(&refs(&args));
    assert!(meta.exists() && map.exists());
    assert_tree_eq(&sc.mp, &sc.src);
    m.umount();
    // Unused for 40 days: collected by the default age; but a mount that
    // reuses it first refreshes its time, and it is kept.
    age_by(&meta, 40 * 86400);
    let m = sc.mount(&refs(&args));
    m.umount();
    let r = kernel_gc(&cache, "30d");
    assert_eq!(
        (r["removed"].as_u64(), r["kept"].as_u64()),
        (Some(0), Some(1)),
        "{r}"
    );
    age_by(&meta, 40 * 86400);
    let r = kernel_gc(&cache, "30d");
    assert_eq!(
        (r["removed"].as_u64(), r["kept"].as_u64()),
        (Some(1), Some(0)),
        "{r}"
    );
    assert!(!meta.exists() && !map.exists());
    // A bad age is one line.
    let o = kernel_gc_run(&cache, "3w", false).fails_with(1);
    assert!(
        o.one_err_line().contains("--older-than 3w: not an age"),
        "{}",
        o.describe()
    );
}
