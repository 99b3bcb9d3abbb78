//! Issue 53, case 3: an image's names never reach a terminal raw. A name
//! holding ESC, BEL, newline, CR and a byte that is not UTF-8 is printed by
//! `du -a`, `info --whiteouts` and `find -printf %p` on a terminal (a pty
//! made by script(1)) quoted as GNU ls quotes it, and an error line naming
//! an entry (extract's "exists and is not a directory", on stderr) always.
//! The expected quoting is GNU ls's own, asked of the same name on disk.

mod common;

use common::*;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Command;

const NAME: &[u8] = b"e\x1b[31mx\x07n\nr\r\xff";

/// No byte under 0x20 but the lines' newlines and the tabs between
/// columns, and no DEL.
fn assert_clean(what: &str, out: &[u8]) {
    if let Some(b) = out
        .iter()
        .find(|&&b| (b < 0x20 && b != b'\n' && b != b'\t') || b == 0x7f)
    {
        panic!("{what}: control byte {b:#04x} reached the terminal: {out:?}");
    }
}

/// How GNU ls shows `name` (a file of that name made in `dir`).
fn ls_quoted(dir: &Path, name: &[u8]) -> String {
    let d = dir.join("ls");
    fs::create_dir_all(&d).unwrap();
    write(&d.join(std::ffi::OsStr::from_bytes(name)), b"");
    let o = Command::new("ls")
        .arg("--quoting-style=shell-escape")
        .arg(&d)
        .output()
        .unwrap();
    assert!(o.status.success());
    String::from_utf8(o.stdout).unwrap().trim_end().to_string()
}

/// `sheaf ARGS` with stdout and stderr on a terminal (a pty that leaves
/// newlines alone): all it wrote there.
fn on_tty(args: &[&str]) -> Vec<u8> {
    let mut line = format!("stty -onlcr; exec '{}'", bin());
    for a in args {
        assert!(!a.contains('\''));
        line.push_str(&format!(" '{a}'"));
    }
    let o = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("script(1) from util-linux");
    assert!(o.status.success(), "{line}: {o:?}");
    o.stdout
}

#[test]
fn names_with_control_bytes_are_quoted_on_a_terminal_and_in_errors() {
    let t = tmpdir();
    let expected = ls_quoted(t.path(), NAME);
    assert!(expected.contains(r"$'\033'"), "{expected}");
    // The path /NAME: the same, the plain '/' inside the first quotes.
    assert!(expected.starts_with('\''));
    let path = format!("'/{}", &expected[1..]);
    let src = t.path().join("src");
    fs::create_dir(&src).unwrap();
    let name = std::ffi::OsStr::from_bytes(NAME);
    fs::create_dir(src.join(name)).unwrap();
    write(&src.join(name).join("inside"), b"x\n");
    let mut wh = b".wh.".to_vec();
    wh.extend_from_slice(NAME);
    write(&src.join(std::ffi::OsStr::from_bytes(&wh)), b"");
    let img = t.path().join("names.sheaf");
    build(&src, &img, &[]);
    let img_s = img.to_str().unwrap();

    let du = on_tty(&["du", "-a", img_s]);
    assert_clean("du -a", &du);
    let du = String::from_utf8_lossy(&du);
    assert!(du.contains(&format!("\t{path}\n")), "{du}");

    let info = on_tty(&["info", img_s, "--whiteouts"]);
    assert_clean("info --whiteouts", &info);
    let info = String::from_utf8_lossy(&info);
    // info lists whiteouts as text (its JSON's strings): the byte that is
    // not UTF-8 is U+FFFD there.
    let lossy = String::from_utf8_lossy(NAME).into_owned();
    let expected_lossy = ls_quoted(&t.path().join("lossy"), lossy.as_bytes());
    assert!(info.contains(&format!("  {expected_lossy}\n")), "{info}");

    let find = on_tty(&["find", img_s, "-printf", "%p|%f\\n"]);
    assert_clean("find -printf", &find);
    let find = String::from_utf8_lossy(&find);
    assert!(find.contains(&format!("{path}|{expected}\n")), "{find}");

    // An error line naming an entry: stderr, a pipe here, always quoted.
    let out = t.path().join("out");
    fs::create_dir(&out).unwrap();
    write(&out.join(name), b"a file where the image has a directory");
    let o = sheaf([
        "extract".as_ref(),
        img.as_os_str(),
        "-C".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(o.code, 1, "{}", o.describe());
    assert_clean("extract's error", o.stderr.as_bytes());
    assert_clean("extract's stdout", &o.stdout);
    assert_eq!(
        o.stderr,
        format!("sheaf: error: {expected}: exists and is not a directory\n")
    );
}
