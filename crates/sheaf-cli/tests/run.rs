//! `sheaf run`: images at fixed paths for one command, in a private mount
//! namespace; exit codes and signals pass through; nothing is left mounted
//! anywhere afterwards, even after kill -9; without root; without
//! namespaces; and as the remote end of sshfs and rsync over a real sshd.

mod common;

use common::servers::Sshd;
use common::*;
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A small image: its source tree and the image.
fn sample(dir: &Path) -> (PathBuf, PathBuf) {
    let src = dir.join("src");
    small_tree(&src, 7);
    write(&src.join("hello.txt"), b"hello from the image\n");
    let img = dir.join("img.sheaf");
    build(&src, &img, &["-q"]);
    (src, img)
}

/// Every mount of `source` in any process's namespace on the machine.
fn mounts_of(source: &Path) -> Vec<String> {
    let needle = format!(" {} ", source.display());
    let mut found = Vec::new();
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name();
        if !name.to_string_lossy().chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        if let Ok(m) = fs::read_to_string(e.path().join("mountinfo")) {
            for l in m.lines().filter(|l| l.contains(&needle)) {
                found.push(format!("pid {}: {l}", name.to_string_lossy()));
            }
        }
    }
    found
}

/// Wait until no process has a mount of `source` (namespaces die with
/// their last process, a moment after it exits).
fn assert_no_mounts_of(source: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = mounts_of(source);
        if m.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "still mounted: {m:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn run(args: &[&str]) -> Command {
    let mut c = cmd();
    c.arg("run").args(args);
    c
}

#[test]
fn exit_codes_stdio_and_signals_pass_through() {
    let t = tmpdir();
    let (_src, img) = sample(t.path());
    let spec = format!("{}:/sheaf-test-data", img.display());
    assert!(!Path::new("/sheaf-test-data").exists());
    // The exit code, stdout, and the image at a path that does not exist.
    let o = run_cmd(&mut run(&[
        "--mount",
        &spec,
        "--",
        "sh",
        "-c",
        "cat /sheaf-test-data/hello.txt; echo err >&2; exit 7",
    ]));
    assert_eq!(o.code, 7, "{}", o.describe());
    assert_eq!(o.text(), "hello from the image\n");
    assert_eq!(o.stderr, "err\n");
    assert!(!Path::new("/sheaf-test-data").exists());
    // stdin reaches the command untouched (and binary data survives).
    let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let mut c = run(&["--mount", &spec, "--", "cat"]);
    let o = run_with_stdin(&mut c, data.clone());
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(o.stdout, data);
    // The command dies of a signal: so does sheaf.
    let st = run(&["--mount", &spec, "--", "sh", "-c", "kill -9 $$"])
        .status()
        .unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{st}");
    // A signal sent to sheaf is passed on; the command's death is sheaf's.
    let mut child = run(&[
        "--mount",
        &spec,
        "--",
        "sh",
        "-c",
        "trap 'echo got-term; exit 42' TERM; echo ready; while :; do sleep 0.05; done",
    ])
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "ready\n");
    // Meanwhile nobody outside sees the mount.
    assert!(!fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .contains("/sheaf-test-data"),);
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert_eq!(line, "got-term\n");
    assert_eq!(st.code(), Some(42), "{st}");
    // Refusals: one line, sheaf's own codes.
    let o = run_cmd(&mut run(&["--mount", &spec, "--", "/no/such/program"]));
    assert_eq!(o.code, 127, "{}", o.describe());
    assert!(o.one_err_line().contains("/no/such/program"));
    let o = run_cmd(&mut run(&[
        "--mount",
        "/no/such.sheaf:/sheaf-test-data",
        "--",
        "true",
    ]));
    assert_eq!(o.code, 125, "{}", o.describe());
    assert!(
        o.one_err_line().contains("/no/such.sheaf"),
        "{}",
        o.describe()
    );
    let o = run_cmd(&mut run(&["--mount", "x.sheaf:relative", "--", "true"]));
    assert_eq!(o.code, 125);
    assert!(o.one_err_line().contains("absolute"), "{}", o.describe());
    assert_no_mounts_of(&img);
}

/// kill -9 of the command or of sheaf itself leaves no mount anywhere and
/// no process behind.
#[test]
fn kill_9_leaves_nothing_mounted() {
    let t = tmpdir();
    let (_src, img) = sample(t.path());
    let spec = format!("{}:/sheaf-test-k9", img.display());
    let pidfile = t.path().join("pid");
    let mut child = run(&[
        "--mount",
        &spec,
        "--",
        "sh",
        "-c",
        &format!("echo $$ > {}; exec sleep 60", pidfile.display()),
    ])
    .spawn()
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() || fs::read_to_string(&pidfile).unwrap().trim().is_empty() {
        assert!(Instant::now() < deadline, "the command did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let cmd_pid: i32 = fs::read_to_string(&pidfile)
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!mounts_of(&img).is_empty(), "not mounted while running");
    // Kill sheaf: the command goes too, and the namespace with its mount.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Path::new(&format!("/proc/{cmd_pid}")).exists() {
        let state = fs::read_to_string(format!("/proc/{cmd_pid}/stat")).unwrap_or_default();
        if state.contains(") Z") {
            break;
        }
        assert!(Instant::now() < deadline, "the command outlived sheaf");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_no_mounts_of(&img);
    // Kill the command: sheaf reports it and cleans up.
    let st = run(&["--mount", &spec, "--", "sh", "-c", "kill -9 $$"])
        .status()
        .unwrap();
    assert_eq!(st.signal(), Some(libc::SIGKILL));
    assert_no_mounts_of(&img);
}

/// Several mounts, one writable: changes land in the upper directory.
#[test]
fn stacks_and_overlays_at_fixed_paths() {
    let t = tmpdir();
    let (_src, img) = sample(t.path());
    let layer_src = t.path().join("layer");
    fs::create_dir_all(&layer_src).unwrap();
    write(&layer_src.join("hello.txt"), b"from the layer\n");
    let layer = t.path().join("layer.sheaf");
    build(&layer_src, &layer, &["-q"]);
    let up = t.path().join("up");
    fs::create_dir_all(&up).unwrap();
    let o = run_cmd(&mut run(&[
        "--mount",
        &format!("{},{}:/opt/sheaf-test/stack", img.display(), layer.display()),
        "--mount",
        &format!("{}:/sheaf-test-w:upper={}", img.display(), up.display()),
        "--",
        "sh",
        "-c",
        "cat /opt/sheaf-test/stack/hello.txt && echo new > /sheaf-test-w/new && rm /sheaf-test-w/hello.txt && umask",
    ]));
    assert_eq!(o.code, 0, "{}", o.describe());
    let mut lines = o.text().lines().map(String::from).collect::<Vec<_>>();
    let umask = lines.pop().unwrap();
    assert_eq!(lines, ["from the layer"]);
    // The command has the caller's umask, not the server's.
    assert_eq!(umask, "0022");
    assert_eq!(fs::read(up.join("new")).unwrap(), b"new\n");
    assert!(up.join(".wh.hello.txt").exists());
    assert!(!Path::new("/opt/sheaf-test").exists());
    assert_no_mounts_of(&img);
}

/// Without namespaces: private temporary mount points in SHEAF_MOUNT_*,
/// removed afterwards.
#[test]
fn without_namespaces_mounts_are_private_temporary_directories() {
    let t = tmpdir();
    let (src, img) = sample(t.path());
    let o = run_cmd(&mut run(&[
        "--no-namespace",
        "--mount",
        &format!("{}:/data", img.display()),
        "--",
        "sh",
        "-c",
        "echo $SHEAF_MOUNT_DATA; echo $SHEAF_MOUNTS; cat $SHEAF_MOUNT_DATA/hello.txt",
    ]));
    assert_eq!(o.code, 0, "{}", o.describe());
    let text = o.text();
    let lines: Vec<&str> = text.lines().collect();
    let at = PathBuf::from(lines[0]);
    assert_eq!(lines[1], format!("/data={}", at.display()));
    assert_eq!(lines[2], "hello from the image");
    let _ = src;
    let deadline = Instant::now() + Duration::from_secs(10);
    while at.parent().unwrap().exists() {
        assert!(Instant::now() < deadline, "{} left behind", at.display());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_no_mounts_of(&img);
}

/// A user without root: the user namespace path (where /dev/fuse is open
/// to users, as Debian's udev rule makes it).
#[test]
fn a_user_runs_with_images_at_fixed_paths() {
    if !prerequisite(is_root(), "root, to create a test user") {
        return;
    }
    let user = "sheaf-mount-test";
    if !Command::new("id")
        .arg(user)
        .output()
        .unwrap()
        .status
        .success()
    {
        run_cmd(Command::new("useradd").args(["--no-create-home", "--shell", "/bin/sh", user]))
            .ok();
    }
    let t = tmpdir();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let (_src, img) = sample(t.path());
    fs::set_permissions(&img, fs::Permissions::from_mode(0o644)).unwrap();
    let dev = fs::metadata("/dev/fuse").unwrap().permissions().mode();
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
    let r = std::panic::catch_unwind(|| {
        let as_user = |args: &[&str]| {
            let mut c = Command::new("setpriv");
            c.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
                .arg(bin())
                .arg("run")
                .args(args)
                .current_dir("/")
                .env("SHEAF_CACHE_DIR", "/tmp/sheaf-run-test-cache");
            run_cmd(&mut c)
        };
        let spec = format!("{}:/sheaf-test-user", img.display());
        let o = as_user(&[
            "--mount",
            &spec,
            "--",
            "sh",
            "-c",
            "id -u; cat /sheaf-test-user/hello.txt; exit 5",
        ]);
        assert_eq!(o.code, 5, "{}", o.describe());
        let uid = String::from_utf8(
            Command::new("id")
                .args(["-u", user])
                .output()
                .unwrap()
                .stdout,
        )
        .unwrap();
        assert_eq!(o.text(), format!("{}hello from the image\n", uid));
        let o = as_user(&["--root", "--mount", &spec, "--", "id", "-u"]);
        assert_eq!(o.code, 0, "{}", o.describe());
        assert_eq!(o.text(), "0\n");
    });
    fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(dev)).unwrap();
    assert_no_mounts_of(&img);
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
}

/// `ssh host sheaf run --mount IMG:/data -- sftp-server` serves sshfs, and
/// rsync pulls through `--rsync-path "sheaf run ... -- rsync"` (what seed
/// 000's sing_sftpd and sing_rsync did with Singularity).
#[test]
fn sftp_server_and_rsync_through_sheaf_run_over_ssh() {
    let t = tmpdir();
    // sshfs cannot read a symlink whose target climbs with `..` (also from
    // a plain directory and the stock sftp-server): use a sibling target.
    let src = t.path().join("src");
    small_tree(&src, 7);
    fs::remove_file(src.join("docs/readme-link")).unwrap();
    symlink(b"b.txt", &src.join("docs/b-link"));
    let img = t.path().join("img.sheaf");
    build(&src, &img, &["-q"]);
    let img = img.canonicalize().unwrap();
    let sshd = Sshd::start(t.path());
    let spec = format!("{}:/data", img.display());
    let mp = t.path().join("mnt");
    fs::create_dir_all(&mp).unwrap();
    let mp = mp.canonicalize().unwrap();
    {
        let remote = format!(
            "{} run --mount {spec} -- /usr/lib/openssh/sftp-server",
            bin()
        );
        let _m = sshd.sshfs(&remote, "/data", &mp);
        let diff = Command::new("diff")
            .args(["-r", "--no-dereference"])
            .arg(&src)
            .arg(&mp)
            .output()
            .unwrap();
        assert!(
            diff.status.success(),
            "{}{}",
            String::from_utf8_lossy(&diff.stdout),
            String::from_utf8_lossy(&diff.stderr)
        );
    }
    // rsync with the remote rsync started inside `sheaf run`.
    let dst = t.path().join("copy");
    let rsync_path = format!("{} run --mount {spec} -- rsync", bin());
    let o = run_cmd(
        Command::new("rsync")
            .arg("-a")
            .arg("-e")
            .arg(sshd.ssh_command())
            .arg("--rsync-path")
            .arg(&rsync_path)
            .arg(format!("{}:/data/", sshd.destination()))
            .arg(&dst),
    );
    assert_eq!(o.code, 0, "{}\n{}", o.describe(), sshd.log_text());
    let diff = Command::new("diff")
        .args(["-r", "--no-dereference"])
        .arg(&src)
        .arg(&dst)
        .output()
        .unwrap();
    assert!(
        diff.status.success(),
        "{}",
        String::from_utf8_lossy(&diff.stdout)
    );
    drop(sshd);
    assert_no_mounts_of(&img);
    let mut f = fs::File::create(t.path().join("done")).unwrap();
    f.write_all(b"ok").unwrap();
}

/// A URL mounts like a file (issue 5's `run --mount URL:DEST`), and
/// `record=` writes the files the command read, in first-read order.
#[test]
fn urls_and_recording_through_run() {
    use common::servers::Nginx;
    let t = tmpdir();
    let (_src, img) = sample(t.path());
    let nginx = Nginx::start(t.path());
    fs::copy(&img, nginx.www.join("img.sheaf")).unwrap();
    let rec = t.path().join("read.txt");
    let o = run_cmd(&mut run(&[
        "--mount",
        &format!(
            "{}:/sheaf-test-url:record={}",
            nginx.url("img.sheaf"),
            rec.display()
        ),
        "--",
        "sh",
        "-c",
        "cat /sheaf-test-url/docs/b.txt /sheaf-test-url/hello.txt > /dev/null && echo read",
    ]));
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(o.text(), "read\n");
    assert_eq!(fs::read_to_string(&rec).unwrap(), "docs/b.txt\nhello.txt\n");
}

/// `run --image` of an untrusted image whose own command reaches for the
/// host's home, /tmp and working directory (issue 53, round two): by
/// default all three are bound read-write; `--no-home` leaves the home out
/// (an empty one instead), `--contain` all three (empty /tmp and home).
#[test]
fn no_home_and_contain_keep_an_images_command_out_of_host_directories() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let src = t.path().join("rootfs");
    common::oci::base_rootfs(&src);
    fs::create_dir_all(src.join(".sheaf.d")).unwrap();
    write(
        &src.join(".sheaf.d/config.json"),
        br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},
            "config":{"Cmd":["/bin/sh","/probe.sh"],"WorkingDir":"/"}}"#,
    );
    // What a hostile image's default command would do.
    write(
        &src.join("probe.sh"),
        b"for d in \"$HOME\" /tmp \"$CWD\"; do\n\
          [ -e \"$d/marker-$TAG\" ] && echo \"sees $d\"\n\
          echo pwned 2>/dev/null > \"$d/pwned-$TAG\" && echo \"wrote $d\"\n\
          done\n\
          exit 0\n",
    );
    let img = t.path().join("c.sheaf");
    build(&src, &img, &["-q"]);
    // Home and working directory outside /tmp, as they usually are (not
    // in the target directory: a checkout may lie under /tmp).
    let outside = tempfile::Builder::new()
        .prefix("sheaf-run-")
        .tempdir_in("/var/tmp")
        .unwrap();
    let home = outside.path().join("home");
    let cwd = outside.path().join("work");
    fs::create_dir(&home).unwrap();
    fs::create_dir(&cwd).unwrap();
    let tag = format!("sheaf-run-test-{}", std::process::id());
    let tmp = Path::new("/tmp");
    let dirs = [home.as_path(), tmp, cwd.as_path()];
    for d in dirs {
        write(&d.join(format!("marker-{tag}")), b"host\n");
    }
    let run_with = |flags: &[&str]| -> String {
        for d in dirs {
            let _ = fs::remove_file(d.join(format!("pwned-{tag}")));
        }
        let mut c = cmd();
        c.current_dir(&cwd).env("HOME", &home).arg("run");
        c.args(["--image", img.to_str().unwrap()]);
        c.args(["-e", &format!("TAG={tag}")]);
        c.args(["-e", &format!("CWD={}", cwd.display())]);
        c.args(flags);
        let o = run_cmd(&mut c).ok();
        o.text()
    };
    let written = |d: &Path| d.join(format!("pwned-{tag}")).exists();
    let (h, w) = (home.display(), cwd.display());

    // Default (unchanged): all three seen and written.
    let out = run_with(&[]);
    assert_eq!(
        out,
        format!("sees {h}\nwrote {h}\nsees /tmp\nwrote /tmp\nsees {w}\nwrote {w}\n")
    );
    assert!(written(&home) && written(tmp) && written(&cwd));

    // --no-home: the home inside is empty and writes to it stay inside.
    let out = run_with(&["--no-home"]);
    assert_eq!(
        out,
        format!("wrote {h}\nsees /tmp\nwrote /tmp\nsees {w}\nwrote {w}\n")
    );
    assert!(!written(&home), "--no-home: the real home was written");
    assert!(written(tmp) && written(&cwd));

    // --contain: nothing of the host's home, /tmp or working directory.
    let out = run_with(&["--contain"]);
    assert_eq!(out, format!("wrote {h}\nwrote /tmp\n"));
    for d in dirs {
        assert!(!written(d), "--contain: {} was written", d.display());
    }
    for d in dirs {
        let _ = fs::remove_file(d.join(format!("marker-{tag}")));
        let _ = fs::remove_file(d.join(format!("pwned-{tag}")));
    }
}
