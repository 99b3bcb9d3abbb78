//! Images over ssh:// against a real sshd on loopback (its own host key and
//! config), through the real OpenSSH client: the commands and a mount read
//! exactly the source; an sshd restart under a mount is a wait, a longer
//! outage EIO past --timeout; a wrong host key is refused with ssh's own
//! words; a missing file is one line.

mod common;
use common::servers::Sshd;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// The image of `small_tree` and its ssh:// URL on `sshd`.
fn image_over_ssh(t: &Path, sshd: &Sshd) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let src = t.join("src");
    small_tree(&src, 7);
    // More than one read's worth of many files, so reads pipeline.
    let mut r = Rng::new(3);
    std::fs::create_dir_all(src.join("many")).unwrap();
    for i in 0..300 {
        write(&src.join(format!("many/f{i:03}")), &r.bytes(3000 + i * 37));
    }
    let img = t.join("img.sheaf");
    build(&src, &img, &["--block-size", "64K"]);
    let url = format!(
        "ssh://{}@127.0.0.1:{}{}",
        sshd.user,
        sshd.port,
        img.display()
    );
    (src, img, url)
}

/// `sheaf mount URL MP ARGS...` reaching `sshd` (common's [`mount`]).
fn ssh_mount(sshd: &Sshd, url: &str, mp: &Path, args: &[&str]) -> Mounted {
    let mut c = mount_cmd(&[url], mp, args);
    c.env("SHEAF_SSH", sshd.ssh_command());
    Mounted::run(&mut c, mp)
}

fn with_ssh(sshd: &Sshd, args: &[&str]) -> Out {
    let mut c = cmd();
    c.args(args).env("SHEAF_SSH", sshd.ssh_command());
    run_cmd(&mut c)
}

#[test]
fn commands_and_a_mount_over_ssh_read_exactly_the_source() {
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let (src, img, url) = image_over_ssh(t.path(), &sshd);
    // info / check / cat / extract over ssh:// equal the local image's.
    let local = json(&sheaf(["info".as_ref(), "--json".as_ref(), img.as_os_str()]).ok());
    let remote = json(&with_ssh(&sshd, &["info", "--json", &url]).ok());
    assert_eq!(remote["root"], local["root"], "{remote}");
    with_ssh(&sshd, &["check", &url]).ok();
    let cat = with_ssh(&sshd, &["cat", &url, "/bin/tool"]).ok();
    assert_eq!(cat.stdout, std::fs::read(src.join("bin/tool")).unwrap());
    let out = t.path().join("out");
    with_ssh(
        &sshd,
        &["extract", &url, "-C", out.to_str().unwrap(), "--no-cache"],
    )
    .ok();
    assert_same_tree(&src, &out, Cmp::all());
    let ls = with_ssh(&sshd, &["ls", &url, "/docs"]).ok();
    assert!(ls.text().contains("a.txt"), "{}", ls.describe());
    // bcast (no launcher: a verified local copy) gives the image itself.
    let copy = t.path().join("copy.sheaf");
    with_ssh(&sshd, &["bcast", &url, copy.to_str().unwrap()]).ok();
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&img).unwrap());
    if !mounts_allowed() {
        return;
    }
    let mp = t.path().join("mp");
    let m = ssh_mount(&sshd, &url, &mp, &["--no-cache"]);
    assert_tree_eq(&mp, &src);
    let st = m.stats();
    assert!(st["remote"]["ssh_bytes"].as_u64().unwrap() > 0, "{st}");
    m.umount();
    // sheaf run: the image at a fixed path for one command.
    let o = with_ssh(
        &sshd,
        &[
            "run",
            "--mount",
            &format!("{url}:/sshdata"),
            "--",
            "cat",
            "/sshdata/docs/b.txt",
        ],
    )
    .ok();
    assert_eq!(o.stdout, std::fs::read(src.join("docs/b.txt")).unwrap());
}

#[test]
fn an_sshd_restart_is_a_wait_and_a_long_outage_is_eio_past_the_timeout() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let mut sshd = Sshd::start(t.path());
    let (src, _img, url) = image_over_ssh(t.path(), &sshd);
    let mp = t.path().join("mp");
    let m = ssh_mount(&sshd, &url, &mp, &["--no-cache", "--timeout", "20"]);
    // A first read works; then sshd (and the session) goes away for 3 s.
    same_content(&src.join("many/f000"), &mp.join("many/f000")).unwrap();
    sshd.stop();
    let reader = {
        let (a, b) = (src.join("bin/tool"), mp.join("bin/tool"));
        std::thread::spawn(move || same_content(&a, &b))
    };
    std::thread::sleep(Duration::from_secs(3));
    sshd.restart();
    if let Err(e) = reader.join().unwrap() {
        panic!(
            "a read across an sshd restart failed: {e}\nstats: {}",
            m.stats()
        );
    }
    assert_tree_eq(&mp, &src);
    let st = m.stats();
    assert!(
        st["remote"]["ssh_reconnects"].as_u64().unwrap() >= 1,
        "{st}"
    );
    m.umount();

    // --timeout 3 and sshd gone for good: EIO within the timeout (and a
    // margin), not a hang.
    let m = ssh_mount(&sshd, &url, &mp, &["--no-cache", "--timeout", "3"]);
    sshd.stop();
    let t0 = Instant::now();
    let e = std::fs::read(mp.join("many/f123")).unwrap_err();
    let took = t0.elapsed();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert!(took < Duration::from_secs(15), "EIO took {took:?}");
    assert!(took >= Duration::from_secs(2), "gave up early: {took:?}");
    m.umount();
}

#[test]
fn a_wrong_host_key_is_refused_with_ssh_s_own_words_and_a_missing_file_is_one_line() {
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let (_src, _img, url) = image_over_ssh(t.path(), &sshd);
    // known_hosts naming another key for this server.
    let other = t.path().join("other_key");
    let o = Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&other)
        .output()
        .unwrap();
    assert!(o.status.success());
    let pubkey = std::fs::read_to_string(other.with_extension("pub")).unwrap();
    let kh = t.path().join("known_hosts");
    write(
        &kh,
        format!("[127.0.0.1]:{} {}", sshd.port, pubkey.trim()).as_bytes(),
    );
    let strict = sshd
        .ssh_command()
        .replace(
            "UserKnownHostsFile=/dev/null",
            &format!("UserKnownHostsFile={}", kh.display()),
        )
        .replace("StrictHostKeyChecking=no", "StrictHostKeyChecking=yes");
    let t0 = Instant::now();
    let mut c = cmd();
    c.args(["info", &url]).env("SHEAF_SSH", &strict);
    let o = run_cmd(&mut c);
    assert_ne!(o.code, 0);
    assert!(t0.elapsed() < Duration::from_secs(10), "refusal waited");
    let lines = o.err_lines();
    assert_eq!(lines.len(), 1, "{}", o.describe());
    assert!(
        lines[0].contains("Host key verification failed") && lines[0].contains("ssh://"),
        "{}",
        o.describe()
    );
    // A missing image: one line naming it, at once.
    let missing = format!("ssh://127.0.0.1:{}/nonexistent/x.sheaf", sshd.port);
    let o = with_ssh(&sshd, &["info", &missing]);
    assert_ne!(o.code, 0);
    assert_eq!(o.err_lines().len(), 1, "{}", o.describe());
    assert!(
        o.stderr.contains("/nonexistent/x.sheaf"),
        "{}",
        o.describe()
    );
}

/// Debian's python3, where `python3-h5py` lives (a pyenv python3 may come
/// first on PATH).
const PY: &str = "/usr/bin/python3";

/// The HDF5-over-SSHFS case: reading a hyperslab of a dataset in an image
/// over ssh:// moves about the blocks that hold it (and the file's HDF5
/// metadata), not the file: ≤ 1.2× their stored size. With readahead off,
/// the setting for random access to remote data (docs/remote.md): default
/// readahead also fetches the block after a read that crosses a block
/// boundary.
#[test]
fn an_hdf5_hyperslab_over_ssh_moves_only_the_blocks_holding_it() {
    if !mounts_allowed() {
        return;
    }
    let has_h5py = Command::new(PY)
        .args(["-c", "import h5py"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(has_h5py, "python3-h5py missing: `make test` installs it");
    let t = tmpdir();
    let sshd = Sshd::start(t.path());
    let src = t.path().join("src");
    std::fs::create_dir_all(&src).unwrap();
    // 4096 x 1024 float32 (16 MiB, contiguous, random: incompressible).
    let h5 = src.join("scan.h5");
    let mk = Command::new(PY)
        .arg("-c")
        .arg(
            "import sys, h5py, numpy as np\n\
             r = np.random.default_rng(5)\n\
             with h5py.File(sys.argv[1], 'w') as f:\n\
             \x20   d = f.create_dataset('data', data=r.random((4096, 1024), dtype=np.float32))\n\
             \x20   print(d.id.get_offset())\n",
        )
        .arg(&h5)
        .output()
        .unwrap();
    assert!(
        mk.status.success(),
        "{}",
        String::from_utf8_lossy(&mk.stderr)
    );
    let data_off: u64 = String::from_utf8_lossy(&mk.stdout).trim().parse().unwrap();
    let block: u64 = 256 << 10;
    let img = t.path().join("img.sheaf");
    build(&src, &img, &["--block-size", "256K"]);
    let url = format!(
        "ssh://{}@127.0.0.1:{}{}",
        sshd.user,
        sshd.port,
        img.display()
    );
    let mp = t.path().join("mp");
    let m = ssh_mount(&sshd, &url, &mp, &["--no-cache", "-o", "readahead=0"]);
    let before = m.stats()["remote"]["ssh_bytes"].as_u64().unwrap();
    let (r0, r1) = (1000u64, 1100u64);
    let sum = |file: &Path| -> String {
        let o = Command::new(PY)
            .arg("-c")
            .arg(format!(
                "import sys, h5py\n\
                 with h5py.File(sys.argv[1], 'r') as f:\n\
                 \x20   print(repr(float(f['data'][{r0}:{r1}].astype('float64').sum())))\n"
            ))
            .arg(file)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(sum(&mp.join("scan.h5")), sum(&h5), "the hyperslab's values");
    let moved = m.stats()["remote"]["ssh_bytes"].as_u64().unwrap() - before;
    // The blocks holding it: the rows' bytes, and the HDF5 metadata h5py
    // reads at the start of the file (superblock, object headers: the first
    // block). Random floats do not compress, so a block is stored at about
    // its size.
    let row = 1024 * 4;
    let (from, to) = (data_off + r0 * row, data_off + r1 * row);
    let mut blocks: std::collections::BTreeSet<u64> = (from / block..=(to - 1) / block).collect();
    blocks.insert(0);
    let holding = blocks.len() as u64 * block;
    eprintln!(
        "hyperslab over ssh: moved {moved} bytes, {} blocks hold it ({holding} bytes): {:.2}x",
        blocks.len(),
        moved as f64 / holding as f64
    );
    assert!(
        moved as f64 <= 1.2 * holding as f64,
        "moved {moved} bytes for a hyperslab held by {} blocks ({holding} bytes)",
        blocks.len()
    );
    m.umount();
}
