//! A hostile image run with `sheaf run --image` leaves the host as it was:
//! a part of containers.rs (`mod host`).

use super::*;

/// Every entry under `dir` (not following symlinks), with its type, mode,
/// owner, size, mtime, content hash and symlink target: what the host
/// looks like there, as the test sees it with std::fs alone.
fn host_listing(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = fs::symlink_metadata(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
        let ft = m.file_type();
        let what = if ft.is_symlink() {
            format!("link -> {}", fs::read_link(&p).unwrap().display())
        } else if ft.is_file() {
            format!("file {}", sha256_hex(&fs::read(&p).unwrap()))
        } else if ft.is_dir() {
            for e in fs::read_dir(&p).unwrap() {
                todo.push(e.unwrap().path());
            }
            "dir".to_string()
        } else if ft.is_fifo() {
            "fifo".to_string()
        } else if ft.is_socket() {
            "socket".to_string()
        } else {
            format!("device {}", m.rdev())
        };
        out.push(format!(
            "{} {:o} {}:{} size {} mtime {}.{} {what}",
            p.display(),
            m.mode(),
            m.uid(),
            m.gid(),
            m.size(),
            m.mtime(),
            m.mtime_nsec()
        ));
    }
    out.sort();
    out
}

#[test]
fn hostile_images_never_touch_the_host_through_run_image() {
    if !mounts_allowed() || !prerequisite(is_root(), "root") {
        return;
    }
    let t = tmpdir();
    // Host directories a hostile image points at: one under /tmp (which the
    // container gets bound, so a path resolved inside the root can reach
    // it), one elsewhere (not bound).
    let host_tmp = t.path().join("host");
    let far = tempfile::Builder::new()
        .prefix("sheaf-hostile-")
        .tempdir_in(env!("CARGO_TARGET_TMPDIR"))
        .unwrap();
    let host_far = far.path().join("host");
    for h in [&host_tmp, &host_far] {
        fs::create_dir(h).unwrap();
        symlink(b"/usr/share/zoneinfo/UTC", &h.join("localtime"));
        write(
            &h.join("passwd"),
            b"known:x:4242:4242::/nonexistent:/bin/false\n",
        );
    }
    let images = t.path().join("images");
    fs::create_dir(&images).unwrap();
    let src = t.path().join("src");
    base_rootfs(&src);
    fs::create_dir(src.join(".sheaf.d")).unwrap();
    write(
        &src.join(".sheaf.d/config.json"),
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},"config":{"Env":["PATH=/usr/bin:/bin"]}}"#,
    );
    let climb = |h: &Path| format!("../../../../../..{}", h.to_str().unwrap());
    let cwd = std::env::current_dir().unwrap();
    let first = |p: &Path| -> Option<String> {
        let c = p.components().nth(1)?;
        let s = c.as_os_str().to_str()?.to_string();
        (![
            "bin", "lib", "lib64", "usr", "etc", "tmp", "proc", "sys", "dev",
        ]
        .contains(&s.as_str()))
        .then_some(s)
    };
    // Each hostile /etc (or other path), made in `src` before its build.
    type Make = Box<dyn Fn(&Path)>;
    let mut variants: Vec<(&str, Make)> = Vec::new();
    for (name, target) in [
        ("etc-absolute-tmp", host_tmp.to_str().unwrap().to_string()),
        ("etc-absolute-far", host_far.to_str().unwrap().to_string()),
        ("etc-climbing-tmp", climb(&host_tmp)),
        ("etc-climbing-far", climb(&host_far)),
    ] {
        variants.push((
            name,
            Box::new(move |s: &Path| symlink(target.as_bytes(), &s.join("etc"))),
        ));
    }
    variants.push((
        "etc-loop",
        Box::new(|s: &Path| {
            symlink(b"/etc2", &s.join("etc"));
            symlink(b"etc", &s.join("etc2"));
        }),
    ));
    variants.push((
        "passwd-directory",
        Box::new(|s: &Path| {
            fs::create_dir_all(s.join("etc/passwd")).unwrap();
            write(&s.join("etc/passwd/x"), b"x\n");
        }),
    ));
    variants.push((
        "hosts-fifo",
        Box::new(|s: &Path| {
            fs::create_dir_all(s.join("etc")).unwrap();
            mknod(&s.join("etc/hosts"), libc::S_IFIFO | 0o644, 0).unwrap();
        }),
    ));
    variants.push((
        "passwd-fifo",
        Box::new(|s: &Path| {
            fs::create_dir_all(s.join("etc")).unwrap();
            mknod(&s.join("etc/passwd"), libc::S_IFIFO | 0o644, 0).unwrap();
            mknod(&s.join("etc/group"), libc::S_IFIFO | 0o644, 0).unwrap();
        }),
    ));
    {
        let dev_target = host_far.join("dev").to_str().unwrap().to_string();
        variants.push((
            "dev-absolute-far",
            Box::new(move |s: &Path| symlink(dev_target.as_bytes(), &s.join("dev"))),
        ));
    }
    // The binds' mount points: the working directory's and $HOME's first
    // components pointing out.
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let cwd_first = first(&cwd);
    let home_first = home
        .as_deref()
        .and_then(first)
        .filter(|h| Some(h) != cwd_first.as_ref());
    {
        let (tmp, far) = (host_tmp.clone(), host_far.clone());
        variants.push((
            "binds-through-links",
            Box::new(move |s: &Path| {
                if let Some(c) = &cwd_first {
                    symlink(tmp.to_str().unwrap().as_bytes(), &s.join(c));
                }
                if let Some(h) = &home_first {
                    symlink(far.to_str().unwrap().as_bytes(), &s.join(h));
                }
            }),
        ));
    }
    let mut built = Vec::new();
    for (name, make) in &variants {
        // Back to the plain base: only the programs and the config.
        for e in fs::read_dir(&src).unwrap() {
            let p = e.unwrap().path();
            let n = p.file_name().unwrap().to_str().unwrap().to_string();
            if ![".sheaf.d", "bin", "lib", "lib64", "usr"].contains(&n.as_str()) {
                if fs::symlink_metadata(&p).unwrap().is_dir() {
                    fs::remove_dir_all(&p).unwrap();
                } else {
                    fs::remove_file(&p).unwrap();
                }
            }
        }
        make(&src);
        let img = images.join(format!("{name}.sheaf"));
        build(&src, &img, &[]);
        built.push((*name, img));
    }
    // Each run's changes to the host, if any (the listing is taken again
    // after each, so one run's damage is not blamed on the next).
    let listing = || {
        let mut l = host_listing(t.path());
        l.extend(host_listing(&host_far));
        l
    };
    let mut before = listing();
    let mut damage = Vec::new();
    for (name, img) in &built {
        for extra in [&[][..], &["--root"][..]] {
            let mut c = Command::new("timeout");
            c.args(["-k", "5", "60"])
                .arg(bin())
                .arg("run")
                .args(extra)
                .arg("--image")
                .arg(img)
                .args([
                    "--",
                    "/bin/sh",
                    "-c",
                    "cat /etc/passwd /etc/hosts >/dev/null 2>&1; :",
                ]);
            c.stdin(std::process::Stdio::null());
            let o = run_cmd(&mut c);
            eprintln!("{name} {extra:?}: exit {} stderr {:?}", o.code, o.stderr);
            // timeout(1) says 124, or the process died of its SIGKILL.
            assert!(
                !matches!(o.code, 124 | -9),
                "{name} {extra:?}: hung:\n{}",
                o.describe()
            );
            o.no_panic();
            if o.code != 0 {
                o.one_err_line();
                assert!(
                    o.stderr.starts_with("sheaf run: "),
                    "{name}: {}",
                    o.describe()
                );
            }
            let after = listing();
            if after != before {
                let gone = before.iter().filter(|l| !after.contains(l));
                let new = after.iter().filter(|l| !before.contains(l));
                damage.push(format!(
                    "{name} {extra:?}:\n  before: {:#?}\n  after: {:#?}",
                    gone.collect::<Vec<_>>(),
                    new.collect::<Vec<_>>()
                ));
                before = after;
            }
        }
    }
    assert!(
        damage.is_empty(),
        "the host changed:\n{}",
        damage.join("\n")
    );
}
