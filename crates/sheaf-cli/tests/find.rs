//! `sheaf find` and `sheaf du` read the image's metadata directly; their
//! answers must equal GNU find's on the extracted tree, and du's totals
//! those summed independently from the source.

mod common;
use common::*;
use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Command;

/// `sheaf SUB IMG ARGS...`, in-process.
fn run_in<S: AsRef<OsStr>>(sub: &str, img: &Path, args: impl IntoIterator<Item = S>) -> Out {
    let mut a: Vec<&OsStr> = vec![sub.as_ref(), img.as_os_str()];
    let rest: Vec<S> = args.into_iter().collect();
    a.extend(rest.iter().map(AsRef::as_ref));
    sheaf_in(a)
}

fn sorted_lines(b: &[u8]) -> Vec<String> {
    let mut v: Vec<String> = String::from_utf8_lossy(b)
        .lines()
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn find_answers_as_gnu_find_does_on_the_extracted_tree() {
    let t = tmpdir();
    let src = t.path().join("src");
    small_tree(&src, 21);
    write(&src.join("docs/README.md"), b"readme\n");
    std::fs::create_dir_all(src.join("empty2/inner")).unwrap();
    write(&src.join("docs/deep/zero"), b"");
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]);
    let out = t.path().join("out");
    extract(&img, &out);
    // A reference file for -newer, between the tree's mtimes (set by
    // small_tree to 1_650_000_000 + 3 s per entry).
    let refp = t.path().join("ref");
    write(&refp, b"");
    set_mtime(&refp, 1_650_000_000 + 12, 0);
    let r = refp.to_str().unwrap();
    let cases: Vec<Vec<&str>> = vec![
        vec!["-type", "f", "-printf", "%P %s %m %y %n\\n"],
        vec!["-name", "*.txt", "-printf", "%P\\n"],
        vec!["!", "-type", "d", "-size", "+2k", "-printf", "%P %s\\n"],
        vec!["!", "-type", "d", "-size", "-1", "-printf", "%P\\n"],
        vec!["-maxdepth", "1", "-printf", "%P %y %M\\n"],
        vec!["-path", "*/deep/*", "-printf", "%P %f\\n"],
        vec!["-empty", "-printf", "%P %y\\n"],
        vec!["-type", "l", "-printf", "%P %l\\n"],
        vec!["-mindepth", "2", "-type", "d", "-printf", "%P\\n"],
        vec!["-iname", "readme*", "-printf", "%P\\n"],
        vec!["-mtime", "+100", "-type", "f", "-printf", "%P\\n"],
        vec!["-mmin", "-5", "-printf", "%P\\n"],
        vec!["-newer", r, "-printf", "%P %T@\\n"],
        vec!["-not", "-newer", r, "-type", "f", "-printf", "%P\\n"],
        // Operators, grouping and -prune, as find(1) parses them.
        vec![
            "(", "-name", "*.txt", "-o", "-type", "l", ")", "-printf", "%P\\n",
        ],
        vec!["-name", "*.txt", "-o", "-type", "d", "-printf", "D %P\\n"],
        vec![
            "!", "(", "-type", "d", "-o", "-name", "*.txt", ")", "-printf", "%P\\n",
        ],
        vec![
            "-name", "deep", "-prune", "-o", "-type", "f", "-printf", "%P\\n",
        ],
        vec![
            "-path", "*/docs", "-prune", "-printf", "P %P\\n", "-o", "-printf", "%P\\n",
        ],
        vec![
            "-type", "l", "-printf", "L %P\\n", ",", "!", "-type", "d", "-size", "+1", "-printf",
            "S %P\\n",
        ],
        vec![
            "-false", "-o", "-true", "-a", "-type", "d", "-printf", "%P\\n",
        ],
        vec![
            "-links",
            "+1",
            "-type",
            "f",
            "-uid",
            "0",
            "-printf",
            "%P %n %U\\n",
        ],
        vec!["-gid", "-1", "-printf", "%P %G\\n"],
        // Permissions, octal and symbolic, exact, all-of and any-of.
        vec!["-perm", "644", "-printf", "%P %m\\n"],
        vec!["-perm", "-u+x", "-printf", "%P\\n"],
        vec!["-perm", "/g+w,o+w", "-printf", "%P\\n"],
        vec!["!", "-perm", "-a=r", "-printf", "%P\\n"],
        vec!["-perm", "/0", "-type", "f", "-printf", "%P\\n"],
        // Owners by name (this machine's), and entries it has none for.
        vec!["-user", "root", "-group", "root", "-printf", "%P %u %g\\n"],
        vec!["-nouser", "-o", "-nogroup", "-printf", "%P\\n"],
        vec!["-lname", "*tool*", "-printf", "%P %l\\n"],
        vec!["-ipath", "*DOCS/*", "-printf", "%P %d\\n"],
        // Times as find(1) formats them (the image keeps mtimes to the ns).
        vec![
            "-type",
            "f",
            "-printf",
            "%P %t|%TY-%Tm-%Td %TH:%TM|%T+|%TS|%Tk|%Ta %Tb|%TT\\n",
        ],
        // Widths and precisions, as find(1) pads and cuts.
        vec![
            "!",
            "-type",
            "d",
            "-printf",
            "%-22P|%8s|%.3f|%05n|%-6u|%3d|%10TY|%y|%-4m\\n",
        ],
        // -depth: the same entries (the order is checked below).
        vec![
            "-depth",
            "-mindepth",
            "1",
            "-maxdepth",
            "2",
            "-printf",
            "%P\\n",
        ],
    ];
    for c in cases {
        let ours = run_in("find", &img, &c).ok();
        let gnu = Command::new("find")
            .arg(".")
            .args(&c)
            .current_dir(&out)
            .output()
            .unwrap();
        assert!(
            gnu.status.success(),
            "find {c:?}: {}",
            String::from_utf8_lossy(&gnu.stderr)
        );
        assert_eq!(
            sorted_lines(&ours.stdout),
            sorted_lines(&gnu.stdout),
            "find {c:?}"
        );
    }
    // A start path and the default action: paths as in the image.
    let ours = run_in("find", &img, ["/docs", "-name", "*.txt"]).ok();
    let gnu = Command::new("find")
        .args(["docs", "-name", "*.txt"])
        .current_dir(&out)
        .output()
        .unwrap();
    let want: Vec<String> = sorted_lines(&gnu.stdout)
        .into_iter()
        .map(|l| format!("/{l}"))
        .collect();
    assert_eq!(sorted_lines(&ours.stdout), want);
    // -print0 separates with NULs; output is in name order, parents first.
    let o = run_in("find", &img, ["/bin", "-print0"]).ok();
    let names: Vec<&[u8]> = o
        .stdout
        .split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .collect();
    assert_eq!(
        names,
        vec![
            &b"/bin"[..],
            b"/bin/random.dat",
            b"/bin/tool",
            b"/bin/tool-link"
        ]
    );
    // -depth lists a directory after everything in it.
    let o = run_in("find", &img, ["-depth"]).ok();
    let lines: Vec<String> = o.text().lines().map(String::from).collect();
    assert_eq!(
        lines.last().map(String::as_str),
        Some("/"),
        "{}",
        o.describe()
    );
    for (i, d) in lines.iter().enumerate() {
        let under = format!("{}/", d.trim_end_matches('/'));
        assert!(
            lines[i + 1..].iter().all(|l| !l.starts_with(&under)),
            "{d} before an entry under it: {lines:?}"
        );
    }
    // -ls: the line GNU find writes, but for the inode number and the
    // blocks, which are the extracted copy's own (and a directory's size).
    let fields = |l: &str, dot: bool| -> Vec<String> {
        l.split_whitespace()
            .skip(2)
            .map(|w| match w.strip_prefix("./") {
                Some(rest) if dot => format!("/{rest}"),
                _ => w.to_string(),
            })
            .collect()
    };
    let gnu = Command::new("find")
        .args([".", "!", "-type", "d", "-ls"])
        .current_dir(&out)
        .output()
        .unwrap();
    let mut want: Vec<Vec<String>> = String::from_utf8_lossy(&gnu.stdout)
        .lines()
        .map(|l| fields(l, true))
        .collect();
    let o = run_in("find", &img, ["!", "-type", "d", "-ls"]).ok();
    let mut got: Vec<Vec<String>> = o.text().lines().map(|l| fields(l, false)).collect();
    want.sort();
    got.sort();
    assert!(!got.is_empty());
    assert_eq!(got, want, "-ls");
    // -inum finds the entry whose number %i printed (all its names).
    let o = run_in("find", &img, ["-name", "README.txt", "-printf", "%i"]).ok();
    let n = o.text();
    let o = run_in("find", &img, ["-inum", &n]).ok();
    assert_eq!(o.text(), "/README.txt\n", "-inum {n}");
    // -quit: the first match only (which one is first is the walk's order).
    let all_files = sorted_lines(
        &Command::new("find")
            .args([".", "-type", "f", "-printf", "/%P\\n"])
            .current_dir(&out)
            .output()
            .unwrap()
            .stdout,
    );
    let o = run_in("find", &img, ["-type", "f", "-print", "-quit"]).ok();
    let got = sorted_lines(&o.stdout);
    assert_eq!(got.len(), 1, "{}", o.describe());
    assert!(all_files.contains(&got[0]), "{got:?} not in {all_files:?}");
    // Bad input: one line, exit 1 or 2.
    for bad in [
        &["-frobnicate"][..],
        &["-type", "x"],
        &["-size", "+3q"],
        &["-o"],
        &["-name", "x", "-o"],
        &["(", "-name", "x"],
        &["-name", "x", ")"],
        &["(", ")"],
        &["!"],
        &["-uid", "root"],
        &["-perm", "8"],
        &["-perm", "u+q"],
        &["-perm", "17777"],
        &["-user", "no-such-user-sheaf"],
        &["-group", "no-such-group-sheaf"],
        &["-printf", "%T"],
        &["-printf", "%-5"],
    ] {
        let o = run_in("find", &img, bad);
        assert_ne!(o.code, 0, "{bad:?}");
        assert_eq!(o.err_lines().len(), 1, "{bad:?}: {}", o.describe());
    }
    // du's contradictions, refused as du(1) refuses them.
    for bad in [&["-s", "-a"][..], &["-s", "-d", "1"]] {
        let o = sheaf_in(
            ["du".as_ref()]
                .into_iter()
                .chain(bad.iter().map(OsStr::new))
                .chain([img.as_os_str()]),
        );
        assert_eq!(o.code, 2, "{bad:?}: {}", o.describe());
        assert_eq!(o.err_lines().len(), 1, "{bad:?}: {}", o.describe());
    }
    for sub in ["find", "du"] {
        let o = run_in(sub, &img, ["/nonexistent"]);
        assert_eq!(o.code, 1, "{}", o.describe());
        // One line, naming the path once.
        assert_eq!(o.err_lines().len(), 1, "{}", o.describe());
        assert_eq!(
            o.stderr.matches("/nonexistent").count(),
            1,
            "{}",
            o.describe()
        );
    }
}

#[test]
fn du_totals_equal_sums_taken_from_the_source() {
    let t = tmpdir();
    let src = t.path().join("src");
    small_tree(&src, 22);
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]);
    // Expected: per directory, the apparent bytes of the files (a hardlinked
    // file once) and symlinks beneath it.
    let mut want: BTreeMap<String, u64> = BTreeMap::new();
    let mut seen = HashSet::new();
    for rel in walk(&src) {
        if rel.is_empty() {
            continue;
        }
        let p = join(&src, &rel);
        let md = std::fs::symlink_metadata(&p).unwrap();
        let size = if md.is_file() {
            if md.nlink() > 1 && !seen.insert(md.ino()) {
                0
            } else {
                md.len()
            }
        } else if md.file_type().is_symlink() {
            md.len()
        } else {
            want.entry(format!("/{}", lossy(&rel))).or_insert(0);
            0
        };
        // Add to every ancestor directory (and the root).
        let rel = lossy(&rel);
        let mut anc = Path::new(&rel).parent();
        while let Some(a) = anc {
            let key = if a.as_os_str().is_empty() {
                "/".to_string()
            } else {
                format!("/{}", a.display())
            };
            *want.entry(key).or_insert(0) += size;
            anc = a.parent();
        }
    }
    want.remove("/");
    let o = sheaf_in([OsStr::new("du"), "--json".as_ref(), img.as_os_str()]).ok();
    let v = json(&o);
    let got: BTreeMap<String, u64> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["path"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
            )
        })
        .collect();
    let root = got["/"];
    let mut got_dirs = got.clone();
    got_dirs.remove("/");
    assert_eq!(got_dirs, want, "per-directory totals");
    let expected_root: u64 = {
        let mut seen = HashSet::new();
        walk(&src)
            .iter()
            .filter(|rel| !rel.is_empty())
            .map(|rel| {
                let md = std::fs::symlink_metadata(join(&src, rel)).unwrap();
                if (md.is_file() && (md.nlink() == 1 || seen.insert(md.ino())))
                    || md.file_type().is_symlink()
                {
                    md.len()
                } else {
                    0
                }
            })
            .sum()
    };
    assert_eq!(root, expected_root, "total");
    // -s: one line, the total.
    let o = sheaf_in([OsStr::new("du"), "-s".as_ref(), img.as_os_str()]).ok();
    assert_eq!(o.text(), format!("{expected_root}\t/\n"));
    // --inodes: per directory, as GNU du --inodes counts the source.
    let gnu = Command::new("du")
        .args(["--inodes", "."])
        .current_dir(&src)
        .output()
        .unwrap();
    assert!(gnu.status.success());
    let gnu: BTreeMap<String, u64> = String::from_utf8_lossy(&gnu.stdout)
        .lines()
        .map(|l| {
            let (n, p) = l.split_once('\t').unwrap();
            let p = p.strip_prefix('.').unwrap();
            let p = if p.is_empty() { "/" } else { p };
            (p.to_string(), n.parse().unwrap())
        })
        .collect();
    let o = sheaf_in([OsStr::new("du"), "--inodes".as_ref(), img.as_os_str()]).ok();
    let ours: BTreeMap<String, u64> = o
        .text()
        .lines()
        .map(|l| {
            let (n, p) = l.split_once('\t').unwrap();
            (p.to_string(), n.parse().unwrap())
        })
        .collect();
    assert_eq!(ours, gnu, "du --inodes");
    // -a: a row for each file too, with its own size (a hardlink once).
    let o = sheaf_in([
        OsStr::new("du"),
        "-a".as_ref(),
        "--json".as_ref(),
        img.as_os_str(),
    ])
    .ok();
    let rows = json(&o);
    let rows = rows.as_array().unwrap();
    let file_rows = rows
        .iter()
        .filter(|r| {
            let p = r["path"].as_str().unwrap();
            std::fs::symlink_metadata(src.join(&p[1..])).is_ok_and(|m| !m.is_dir())
        })
        .count();
    let mut seen = HashSet::new();
    let files = walk(&src)
        .iter()
        .filter(|rel| !rel.is_empty())
        .filter(|rel| {
            let md = std::fs::symlink_metadata(join(&src, rel)).unwrap();
            !md.is_dir()
                && (md.nlink() == 1 || md.file_type().is_symlink() || seen.insert(md.ino()))
        })
        .count();
    assert_eq!(file_rows, files, "{}", o.describe());
    let readme = rows.iter().find(|r| r["path"] == "/README.txt").unwrap();
    let md = std::fs::metadata(src.join("README.txt")).unwrap();
    assert_eq!(readme["bytes"].as_u64(), Some(md.len()));
    assert_eq!(readme["inodes"].as_u64(), Some(1));
}

/// `sheaf du -h` prints sizes and counts as GNU `du -h` does (powers of
/// 1024, rounded up, one decimal below 10), so that `sort -h` orders them.
/// Expected strings: GNU du itself, on the source's files and, for the
/// directories' totals (GNU adds directories' own sizes, sheaf does not),
/// on sparse files of exactly those sizes.
#[test]
fn du_h_prints_sizes_as_gnu_du_h() {
    let t = tmpdir();
    let src = t.path().join("src");
    let sizes: &[(&str, u64)] = &[
        ("a/zero", 0),
        ("a/one", 1),
        ("a/k1023", 1023),
        ("b/k1024", 1024),
        ("b/k1025", 1025),
        ("c/k10239", 10239),
        ("c/d/k10241", 10241),
        ("c/d/m1048575", 1_048_575),
        ("e/k104857", 104_857),
        ("g/big", 1_300_000_000),
    ];
    for (p, n) in sizes {
        let p = src.join(p);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        // Sparse: the bytes that count are the apparent size.
        std::fs::File::create(&p).unwrap().set_len(*n).unwrap();
    }
    std::fs::create_dir_all(src.join("f/empty")).unwrap();
    // 1100 entries: --inodes -h counts in K as well.
    for i in 0..1100 {
        std::fs::write(src.join(format!("f/n{i}")), b"").unwrap();
    }
    let img = t.path().join("img.sheaf");
    build(&src, &img, &[]);
    let rows = |o: &Out| -> Vec<(String, String)> {
        o.text()
            .lines()
            .map(|l| {
                let (n, p) = l.split_once('\t').unwrap();
                (p.to_string(), n.to_string())
            })
            .collect()
    };
    let gnu = |dir: &Path, args: &[&str]| -> BTreeMap<String, String> {
        let o = Command::new("du")
            .args(args)
            .current_dir(dir)
            .output()
            .unwrap();
        assert!(o.status.success(), "du {args:?}");
        String::from_utf8(o.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                let (n, p) = l.split_once('\t').unwrap();
                let p = p.strip_prefix('.').unwrap();
                (
                    if p.is_empty() { "/" } else { p }.to_string(),
                    n.to_string(),
                )
            })
            .collect()
    };
    // Files: as GNU du -a -h --apparent-size prints them.
    let gnu_files = gnu(&src, &["-a", "-h", "--apparent-size", "."]);
    let ours = rows(
        &sheaf_in([
            OsStr::new("du"),
            "-a".as_ref(),
            "-h".as_ref(),
            img.as_os_str(),
        ])
        .ok(),
    );
    let mut files = 0;
    for (p, h) in &ours {
        if std::fs::symlink_metadata(src.join(&p[1..]))
            .unwrap()
            .is_file()
        {
            assert_eq!(Some(h), gnu_files.get(p), "{p}");
            files += 1;
        }
    }
    assert_eq!(files, sizes.len() + 1100);
    // Directories: each total (bytes, from sheaf du, checked against the
    // source by du_totals_equal_sums_taken_from_the_source) as GNU du -h
    // prints a file of that size.
    let bytes = rows(&sheaf_in([OsStr::new("du"), img.as_os_str()]).ok());
    let human = rows(&sheaf_in([OsStr::new("du"), "-h".as_ref(), img.as_os_str()]).ok());
    assert_eq!(bytes.len(), human.len());
    let scratch = t.path().join("sizes");
    std::fs::create_dir(&scratch).unwrap();
    for (i, (_, n)) in bytes.iter().enumerate() {
        std::fs::File::create(scratch.join(format!("{i}")))
            .unwrap()
            .set_len(n.parse().unwrap())
            .unwrap();
    }
    let gnu_sizes = gnu(&scratch, &["-a", "-h", "--apparent-size", "."]);
    for (i, ((p, _), (hp, h))) in bytes.iter().zip(&human).enumerate() {
        assert_eq!(p, hp);
        assert_eq!(Some(h), gnu_sizes.get(&format!("/{i}")), "{p}");
    }
    assert!(
        human.iter().any(|(p, h)| p == "/g" && h == "1.3G"),
        "{human:?}"
    );
    // sort -h puts the rows in the order of their byte counts.
    let mut sort = Command::new("sort")
        .arg("-h")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let text: String = human.iter().map(|(p, h)| format!("{h}\t{p}\n")).collect();
    use std::io::Write as _;
    sort.stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let sorted = sort.wait_with_output().unwrap();
    assert!(sorted.status.success());
    let by_path: BTreeMap<&str, u64> = bytes
        .iter()
        .map(|(p, n)| (p.as_str(), n.parse().unwrap()))
        .collect();
    // (Rows that print alike, 1.1M and 1.1M, may come in either order.)
    let order: Vec<(u64, String)> = String::from_utf8(sorted.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let (h, p) = l.split_once('\t').unwrap();
            (by_path[p], h.to_string())
        })
        .collect();
    assert!(
        order
            .windows(2)
            .all(|w| w[0].0 <= w[1].0 || w[0].1 == w[1].1),
        "{order:?}"
    );
    // --inodes -h: as GNU du --inodes -h (1100 entries is 1.1K).
    let ours: BTreeMap<String, String> = rows(
        &sheaf_in([
            OsStr::new("du"),
            "--inodes".as_ref(),
            "-h".as_ref(),
            img.as_os_str(),
        ])
        .ok(),
    )
    .into_iter()
    .collect();
    assert_eq!(ours, gnu(&src, &["--inodes", "-h", "."]));
    assert_eq!(ours["/f"], "1.1K");
}
