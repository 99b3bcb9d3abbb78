//! Images read over HTTP from a real nginx started on loopback by the test:
//! every command works on a URL as on a file, a mount over HTTP equals the
//! source, and a dead or lying server gives a clear error, never wrong bytes.

mod common;

use common::servers::Nginx;
use common::*;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn served(dir: &Path) -> (Nginx, PathBuf, PathBuf) {
    let ng = Nginx::start(dir);
    let src = dir.join("src");
    fs::create_dir_all(&src).unwrap();
    small_tree(&src, 21);
    write(&src.join("big.bin"), &Rng::new(2).bytes(9 << 20));
    let img = ng.www.join("img.sheaf");
    build(&src, &img, &[]).ok();
    (ng, src, img)
}

#[test]
fn every_command_reads_a_url_like_a_file() {
    let t = tmpdir();
    let (ng, src, img) = served(t.path());
    let url = ng.url("img.sheaf");
    for args in [vec!["info", "--json"], vec!["ls", "-l", "-R"]] {
        let local = sheaf(
            [args[0]]
                .into_iter()
                .chain([img.to_str().unwrap()])
                .chain(args[1..].iter().copied()),
        )
        .ok()
        .text();
        let remote = sheaf(
            [args[0]]
                .into_iter()
                .chain([url.as_str()])
                .chain(args[1..].iter().copied()),
        )
        .ok()
        .text();
        // The image name differs; everything else is the same.
        assert_eq!(
            local.replace(img.to_str().unwrap(), "IMG"),
            remote.replace(&url, "IMG"),
            "{args:?}"
        );
    }
    sheaf(["check", url.as_str()]).ok();
    let cat = sheaf(["cat", url.as_str(), "big.bin"]).ok();
    assert!(cat.stdout == fs::read(src.join("big.bin")).unwrap());
    let out = t.path().join("out");
    sheaf(["extract", url.as_str(), "-C", out.to_str().unwrap()]).ok();
    assert_same_tree(
        &src,
        &out,
        Cmp {
            owner: is_root(),
            ..Cmp::all()
        },
    );
}

#[test]
fn a_mount_over_http_equals_the_source() {
    let t = tmpdir();
    let (ng, src, _img) = served(t.path());
    let guard = mount(&[ng.url("img.sheaf")], &t.path().join("mnt"), &[]);
    assert_tree_eq(&guard.mp, &src);
    let s = guard.stats();
    assert!(s["image"].as_str().unwrap().starts_with("http://"));
    assert!(s["image_reads"].as_u64().unwrap() > 0);
    guard.umount();
}

#[test]
fn missing_dead_and_lying_servers_are_clear_errors() {
    let t = tmpdir();
    let (mut ng, src, img) = served(t.path());
    // 404.
    let o = run_cmd(cmd().arg("info").arg(ng.url("nope.sheaf"))).fails_with(1);
    assert!(
        o.one_err_line().contains("nope.sheaf: HTTP 404"),
        "{}",
        o.describe()
    );
    // A server that changes a byte of the image: the reader's hashes catch it.
    let mut b = fs::read(&img).unwrap();
    b[64 + 5000] ^= 0x20;
    fs::write(ng.www.join("lying.sheaf"), &b).unwrap();
    let o = run_cmd(cmd().arg("cat").arg(ng.url("lying.sheaf")).arg("big.bin")).fails_with(1);
    assert!(o.one_err_line().contains("lying.sheaf"), "{}", o.describe());
    // Whatever was written before the damage was met is the file's own
    // bytes, and the file was not written whole.
    let big = fs::read(src.join("big.bin")).unwrap();
    assert!(
        o.stdout.len() < big.len(),
        "the damaged image was read whole"
    );
    assert!(
        big.starts_with(&o.stdout),
        "wrong bytes were written (first {} bytes differ from the file)",
        o.stdout.len()
    );
    // The server dies under a mount: once --timeout has passed, readers get
    // EIO, not a hang.
    let mp = t.path().join("mnt");
    let guard = mount(&[ng.url("img.sheaf")], &mp, &["--timeout", "5"]);
    let big_before = fs::metadata(mp.join("big.bin")).unwrap().len();
    ng.stop();
    let (tx, rx) = std::sync::mpsc::channel();
    let f = mp.join("big.bin");
    std::thread::spawn(move || tx.send(fs::read(f)).unwrap());
    let r = rx
        .recv_timeout(Duration::from_secs(30))
        .expect("a read hung after the server died");
    match r {
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}"),
        Ok(data) => panic!(
            "read {} of {big_before} bytes from a dead server",
            data.len()
        ),
    }
    drop(guard);
    // No server at all: one line, once --timeout has passed.
    let o = run_cmd(
        cmd()
            .arg("info")
            .arg(ng.url("img.sheaf"))
            .args(["--timeout", "2"]),
    )
    .fails_with(1);
    assert!(
        o.one_err_line()
            .to_lowercase()
            .contains("connection refused"),
        "{}",
        o.describe()
    );
    let _ = src;
}
