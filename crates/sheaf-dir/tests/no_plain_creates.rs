//! The safe way is the only way: code that works in directories someone
//! else may control (a container's upper directory, a shared cache, a
//! writable install directory, pool directories, an extraction target, a
//! writable union's upper directory) creates, copies and renames there only
//! through `sheaf_dir` (or, in the union and extraction, their own
//! descriptor-relative calls). This test fails on a path-based create in
//! those files; a line that works on a path the user named (and so may
//! follow the user's own links) says so with `// trusted-path: WHY` on it
//! or on the line above.

use std::path::{Path, PathBuf};

/// The files and directories (under `crates/`) held to the rule.
const GUARDED: &[&str] = &[
    "sheaf-snapshotter/src",
    "sheaf-bcast/src",
    "sheaf-pool/src",
    "sheaf-net/src/cache.rs",
    "sheaf-read/src/extract.rs",
    "sheaf-build/src/upper.rs",
    "sheaf-build/src/lib.rs",
    "sheaf-mount/src/union",
    "sheaf-cli/src/pool.rs",
    "sheaf-cli/src/bcast.rs",
];

/// Path-based calls that create, replace or follow: each would write
/// through a link planted in the directory.
const FORBIDDEN: &[&str] = &[
    "File::create(",
    "fs::write(",
    "fs::copy(",
    "fs::rename(",
    "fs::create_dir_all(",
    "fs::create_dir(",
    ".create(true)",
    ".create_new(true)",
    "os::unix::fs::symlink(",
    "fs::hard_link(",
    "set_permissions(",
];

fn files(p: &Path, out: &mut Vec<PathBuf>) {
    if p.is_dir() {
        let mut v: Vec<_> = std::fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        v.sort();
        for e in v {
            files(&e, out);
        }
    } else if p.extension().is_some_and(|e| e == "rs") && !p.ends_with("tests.rs") {
        out.push(p.to_path_buf());
    }
}

/// The offending lines of `text`: test modules (from a `#[cfg(test)]` at
/// the start of a line to the end of the file, and files named
/// `tests.rs`) are left out.
fn offences(text: &str) -> Vec<(usize, String)> {
    let mut v = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with("#[cfg(test)]") {
            break;
        }
        let code = l.split("//").next().unwrap_or("");
        let excused = l.contains("trusted-path:")
            || (i > 0 && lines[i - 1].trim_start().starts_with("// trusted-path:"));
        if !excused && FORBIDDEN.iter().any(|f| code.contains(f)) {
            v.push((i + 1, l.trim().to_string()));
        }
    }
    v
}

#[test]
fn no_plain_creates() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut all = Vec::new();
    for g in GUARDED {
        let p = crates.join(g);
        assert!(p.exists(), "{}: guarded but missing", p.display());
        files(&p, &mut all);
    }
    assert!(all.len() >= GUARDED.len());
    let mut bad = Vec::new();
    for f in &all {
        let text = std::fs::read_to_string(f).unwrap();
        for (n, l) in offences(&text) {
            bad.push(format!(
                "{}:{n}: {l}",
                f.strip_prefix(&crates).unwrap_or(f).display()
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "path-based creates in directories sheaf does not trust (use sheaf_dir::Dir, \
         or mark a path the user named with `// trusted-path: WHY`):\n{}",
        bad.join("\n")
    );
}

#[test]
fn the_lint_sees_what_it_forbids() {
    let src = "fn f() {\n    std::fs::File::create(p)?;\n    fs::write(&p, b)?; // trusted-path: the user's -o\n    // trusted-path: the user's DIR\n    std::fs::create_dir_all(d)?;\n    OpenOptions::new().create(true).open(p)?;\n}\n#[cfg(test)]\nmod tests { fn g() { File::create(p); } }\n";
    let v = offences(src);
    assert_eq!(v.iter().map(|x| x.0).collect::<Vec<_>>(), vec![2, 6]);
}
