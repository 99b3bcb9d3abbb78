//! Installed like a real tool: a man page per command that man(1) renders,
//! shell completions that bash-completion runs (commands, options, image
//! paths), and the Debian package `make deb` writes — its contents, its
//! Depends, and (as root, outside the fast tier) a real `dpkg -i`, use and
//! `dpkg -P` that leaves nothing behind.

mod common;

use common::*;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Whether `name` is an executable on PATH.
fn on_path(name: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            fs::metadata(d.join(name)).is_ok_and(|m| {
                use std::os::unix::fs::PermissionsExt;
                m.is_file() && m.permissions().mode() & 0o111 != 0
            })
        })
    })
}

/// The repository's root (scripts/, Makefile).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The commands `sheaf ... --help` lists under "Commands:", as the man
/// page names they should have (`sheaf-pool-load`), found independently of
/// the man page generator by walking the help texts.
fn commands_by_help(path: &[String], out: &mut BTreeSet<String>) {
    out.insert(path.join("-"));
    let o = sheaf(path[1..].iter().map(String::as_str).chain(["--help"])).ok();
    let text = o.text();
    let Some(list) = text.split("\nCommands:\n").nth(1) else {
        return;
    };
    for line in list.lines().take_while(|l| l.starts_with("  ")) {
        let name = line.split_whitespace().next().expect("a command name");
        if name != "help" {
            let mut p = path.to_vec();
            p.push(name.to_string());
            commands_by_help(&p, out);
        }
    }
}

/// Lines troff may print for a page that still renders whole: a line it
/// cannot justify because of one long unbreakable word.
fn harmless_troff_line(l: &str) -> bool {
    l.contains("warning") && (l.contains("cannot adjust line") || l.contains("can't break line"))
}

/// The page as `man -l` renders it, 100 columns wide; man (troff) said
/// nothing but harmless lines on its standard error.
fn man_l(page: &Path) -> String {
    let o = run_cmd(
        Command::new("man")
            .arg("-l")
            .arg(page)
            .env("MANWIDTH", "100")
            .env("LANG", "C.UTF-8")
            .env_remove("MANPAGER")
            .env_remove("PAGER")
            .stdin(Stdio::null()),
    )
    .ok();
    let bad: Vec<&str> = o
        .err_lines()
        .into_iter()
        .filter(|l| !harmless_troff_line(l))
        .collect();
    assert!(
        bad.is_empty(),
        "{}: man -l complained:\n{}",
        page.display(),
        o.describe()
    );
    o.text()
}

#[test]
fn every_command_has_a_man_page_that_man_renders() {
    if !prerequisite(on_path("man"), "man (Debian package man-db)") {
        return;
    }
    let t = tmpdir();
    let dir = t.path().join("man1");
    // Through the small `sheaf`, which hands the hidden command to sheaf-full.
    sheaf(["man".as_ref(), "--dir".as_ref(), dir.as_os_str()]).ok();
    let written: BTreeSet<String> = fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    let mut commands = BTreeSet::new();
    commands_by_help(&["sheaf".to_string()], &mut commands);
    for must in [
        "sheaf",
        "sheaf-mount",
        "sheaf-pool-load",
        "sheaf-cache-gc",
        "sheaf-completions",
    ] {
        assert!(
            commands.contains(must),
            "{must} missing from --help: {commands:?}"
        );
    }
    let expected: BTreeSet<String> = commands.iter().map(|c| format!("{c}.1")).collect();
    assert_eq!(written, expected, "man pages written vs commands in --help");
    assert!(!written.contains("sheaf-man.1") && !written.contains("sheaf-help.1"));
    assert!(
        !sheaf(["--help"]).ok().text().contains("\n  man "),
        "the man command is hidden from --help"
    );

    for page in &written {
        let name = page.trim_end_matches(".1");
        let text = man_l(&dir.join(page));
        assert!(text.len() > 200, "{page}: rendered nearly empty:\n{text}");
        assert!(text.contains(name), "{page}: does not name {name}:\n{text}");
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS"] {
            assert!(
                text.lines().any(|l| l == section),
                "{page}: no {section} section:\n{text}"
            );
        }
        assert!(
            text.contains("--help"),
            "{page}: options not listed:\n{text}"
        );
    }
    // What a page says comes from the same definitions as --help.
    let mount = fs::read_to_string(dir.join("sheaf-mount.1")).unwrap();
    assert!(mount.contains("\\-\\-upper") && mount.contains("\\-\\-foreground"));
    let load = fs::read_to_string(dir.join("sheaf-pool-load.1")).unwrap();
    assert!(load.contains("sheaf pool load") && load.contains("\\-\\-sh"));
}

/// Text with man(1)'s terminal emphasis (`X\bX` bold, `_\bX` underline)
/// taken out, as `col -b` does.
fn unemphasised(s: &str) -> String {
    let mut out: Vec<char> = Vec::new();
    for c in s.chars() {
        if c == '\u{8}' {
            out.pop();
            continue;
        }
        out.push(c);
    }
    out.into_iter().collect()
}

/// The plugstack.conf keys `parse_args` in `src` (slurm/sheaf_spank.c)
/// accepts, each with the whole-argument values it names (`scope=job` gives
/// `scope` and `job`; `sheaf=` gives `sheaf` and none): every string literal
/// of parse_args's body that is a lower-case key followed by `=`. Found in
/// the C source itself, not in the pages under test.
fn plugstack_keys(src: &str) -> std::collections::BTreeMap<String, BTreeSet<String>> {
    let start = src
        .find("static int parse_args(")
        .expect("parse_args in slurm/sheaf_spank.c");
    let body = &src[start..];
    let body = &body[..body.find("\n}\n").expect("the end of parse_args")];
    let mut keys = std::collections::BTreeMap::<String, BTreeSet<String>>::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        match c {
            // A character literal ('"' or '\'') is not the start of a string.
            '\'' => {
                if chars.next() == Some('\\') {
                    chars.next();
                }
                chars.next();
            }
            '"' => {
                let mut lit = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => lit.extend(chars.next()),
                        '"' => break,
                        c => lit.push(c),
                    }
                }
                let Some((key, value)) = lit.split_once('=') else {
                    continue;
                };
                if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    let values = keys.entry(key.to_string()).or_default();
                    if !value.is_empty() {
                        values.insert(value.to_string());
                    }
                }
            }
            _ => {}
        }
    }
    keys
}

/// What a page (its text as man renders it, or docs/slurm.md) does not say
/// of `keys`: a key with no entry of its own, a value never named.
fn undocumented(
    keys: &std::collections::BTreeMap<String, BTreeSet<String>>,
    has_key: impl Fn(&str) -> bool,
    text: &str,
) -> Vec<String> {
    let mut missing = Vec::new();
    for (key, values) in keys {
        if !has_key(key) {
            missing.push(format!("{key}="));
        }
        for v in values {
            if !text.contains(&format!("{key}={v}")) && !text.contains(&format!("|{v}")) {
                missing.push(format!("{key}={v}"));
            }
        }
    }
    missing
}

/// slurm/sheaf-slurm.8, the Slurm plugin's page (installed by `make
/// install-files` to share/man/man8): man renders it without a complaint,
/// and it and docs/slurm.md name every plugstack.conf argument the plugin
/// accepts and both of its options.
#[test]
fn the_slurm_plugin_has_a_man_page_that_names_every_plugstack_argument() {
    let src = fs::read_to_string(repo_root().join("slurm/sheaf_spank.c")).unwrap();
    let keys = plugstack_keys(&src);
    for must in ["sheaf", "config", "pools", "scope", "mode", "timeout"] {
        assert!(
            keys.contains_key(must),
            "{must} not found in parse_args: {keys:?}"
        );
    }
    assert!(
        keys["scope"].contains("job") && keys["mode"].contains("bcast"),
        "{keys:?}"
    );
    // The extraction sees a key added to parse_args (a copy of the source).
    let added = src.replacen(
        "if (!strncmp(a, \"sheaf=\", 6))",
        "if (!strncmp(a, \"not_yet=\", 8))\n            ;\n        else if (!strncmp(a, \"sheaf=\", 6))",
        1,
    );
    let more = plugstack_keys(&added);
    assert!(
        more.contains_key("not_yet") && more.len() == keys.len() + 1,
        "{more:?}"
    );

    let docs = fs::read_to_string(repo_root().join("docs/slurm.md")).unwrap();
    let missing = undocumented(&keys, |k| docs.contains(&format!("`{k}=")), &docs);
    assert!(
        missing.is_empty(),
        "docs/slurm.md does not document {missing:?}"
    );
    assert!(!undocumented(&more, |k| docs.contains(&format!("`{k}=")), &docs).is_empty());

    if !prerequisite(on_path("man"), "man (Debian package man-db)") {
        return;
    }
    let text = unemphasised(&man_l(&repo_root().join("slurm/sheaf-slurm.8")));
    assert!(text.starts_with("SHEAF-SLURM(8)"), "{text}");
    for section in [
        "NAME",
        "SYNOPSIS",
        "DESCRIPTION",
        "OPTIONS",
        "CONFIGURATION",
        "MODES",
        "EXIT STATUS",
        "EXAMPLES",
        "FILES",
        "SEE ALSO",
    ] {
        assert!(
            text.lines().any(|l| l == section),
            "sheaf-slurm.8: no {section} section:\n{text}"
        );
    }
    // Each argument has an entry of its own (a line that begins with it).
    let has_entry = |k: &str| {
        text.lines()
            .any(|l| l.trim_start().starts_with(&format!("{k}=")))
    };
    let missing = undocumented(&keys, has_entry, &text);
    assert!(
        missing.is_empty(),
        "sheaf-slurm.8 does not document {missing:?}:\n{text}"
    );
    assert!(!undocumented(&more, has_entry, &text).is_empty());
    for option in ["--sheaf=IMAGE", "--sheaf-pool=NAME/VERSION"] {
        assert!(
            text.lines().any(|l| l.trim_start().starts_with(option)),
            "sheaf-slurm.8: no entry for {option}:\n{text}"
        );
    }
    assert!(
        text.contains("125") && text.contains("sheaf: error:"),
        "{text}"
    );
}

/// `sheaf help CMD [SUB]` shows the command's manual page without
/// installing anything: man's rendering into a pipe, through the user's
/// pager on a terminal, clap's long help where man(1) is missing; a command
/// that does not exist is one line and exit 2.
#[test]
fn help_command_shows_its_manual_page_without_installing() {
    if !prerequisite(
        on_path("man") && on_path("script"),
        "man and script (Debian packages man-db, bsdutils)",
    ) {
        return;
    }
    // Into a pipe: the page as man renders it, plain text.
    let o = sheaf(["help", "mount"]).ok();
    let text = o.text();
    assert!(!text.contains('\u{8}'), "no terminal emphasis in a pipe");
    for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "OPTIONS"] {
        assert!(
            text.lines().any(|l| l == section),
            "no {section} section:\n{text}"
        );
    }
    assert!(text.starts_with("sheaf-mount(1)"), "{text}");
    assert!(text.contains("--upper") && text.contains("--foreground"));
    // A subcommand's page.
    let text = sheaf(["help", "pool", "load"]).ok().text();
    assert!(text.starts_with("sheaf-pool-load(1)"), "{text}");
    let synopsis = text.split("\nSYNOPSIS\n").nth(1).expect("a SYNOPSIS");
    // (man justifies lines: words may be two spaces apart)
    let words: Vec<&str> = synopsis.split_whitespace().take(3).collect();
    assert_eq!(words, ["sheaf", "pool", "load"], "{text}");
    assert!(text.contains("--sh"), "{text}");
    // The same page as `sheaf man --dir` writes, rendered by man -l.
    let t = tmpdir();
    let dir = t.path().join("man1");
    sheaf(["man".as_ref(), "--dir".as_ref(), dir.as_os_str()]).ok();
    let installed = run_cmd(
        Command::new("man")
            .arg("-l")
            .arg(dir.join("sheaf-pool-load.1"))
            .env_remove("MANPAGER")
            .env_remove("PAGER")
            .stdin(Stdio::null()),
    )
    .ok()
    .text();
    assert_eq!(text, installed);
    // In-process (a test's buffers): the same.
    assert_eq!(sheaf_in(["help", "pool", "load"]).ok().text(), installed);

    // On a terminal: man(1) itself, through the user's pager, with emphasis.
    let paged = t.path().join("paged");
    let line = format!("{} help mount", bin());
    run_cmd(
        Command::new("script")
            .args(["-qec", &line, "/dev/null"])
            .env("MANPAGER", format!("tee {}", paged.display()))
            .env("TERM", "xterm")
            .stdin(Stdio::null()),
    )
    .ok();
    let p = fs::read_to_string(&paged).expect("man ran the pager");
    assert!(p.contains('\u{8}'), "bold on a terminal: {p}");
    assert!(
        unemphasised(&p).lines().any(|l| l == "SYNOPSIS"),
        "{}",
        unemphasised(&p)
    );

    // Without man(1): clap's long help of the command.
    let empty = t.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let o = run_cmd(cmd().args(["help", "mount"]).env("PATH", &empty)).ok();
    assert!(
        o.text().contains("Usage: sheaf mount") && o.text().contains("--upper"),
        "{}",
        o.describe()
    );

    // `sheaf help` alone is still the overview.
    let overview = sheaf(["help"]).ok().text();
    assert!(overview.contains("Commands:"), "{overview}");
    assert!(overview.contains("sheaf help COMMAND"), "{overview}");

    // `sheaf help remote` is a topic, not a command: every flag under the
    // heading "Remote images (URLs)" of `sheaf --help`, explained.
    let top = sheaf(["--help"]).ok().text();
    let flags: Vec<&str> = top
        .split("\nRemote images (URLs):\n")
        .nth(1)
        .expect("a remote heading in --help")
        .lines()
        .take_while(|l| l.starts_with("  "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    assert!(
        flags.len() >= 7 && flags.contains(&"--cache-size"),
        "{flags:?}"
    );
    let remote = sheaf(["help", "remote"]).ok().text();
    for f in &flags {
        assert!(remote.contains(&format!("\n      {f} ")), "{f}: {remote}");
    }
    assert!(remote.contains("ssh://") && !remote.contains("SYNOPSIS"));

    // A command that does not exist: one line naming it, exit 2.
    for (args, line) in [
        (
            &["help", "nosuch"][..],
            "sheaf: help: no command 'nosuch' (see 'sheaf --help')",
        ),
        (
            &["help", "pool", "nosuch"][..],
            "sheaf: help: no command 'nosuch' (see 'sheaf pool --help')",
        ),
        (
            &["help", "man"][..],
            "sheaf: help: no command 'man' (see 'sheaf --help')",
        ),
    ] {
        let o = sheaf(args).fails_with(2);
        assert_eq!(o.one_err_line(), line, "{}", o.describe());
        assert!(o.stdout.is_empty(), "{}", o.describe());
    }
}

const BASH_COMPLETION: &str = "/usr/share/bash-completion/bash_completion";

/// The candidates `_sheaf` puts in COMPREPLY for the command line `words`
/// (the last one being completed), with bash-completion's framework and the
/// generated script loaded, run in `cwd`.
fn complete(script: &Path, cwd: &Path, words: &[&str]) -> Vec<String> {
    complete_line(script, cwd, &words.join(" "), words)
}

/// [`complete`] with the command line as typed (`line`) apart from the
/// words bash made of it (`words`: bash splits `a=b` at `=`), and the
/// `sheaf` under test first on PATH (the script runs it to list images).
fn complete_line(script: &Path, cwd: &Path, line: &str, words: &[&str]) -> Vec<String> {
    let prog = r#"
source /usr/share/bash-completion/bash_completion || exit 97
source "$1" || exit 98
shift
COMP_WORDS=("$@")
COMP_CWORD=$(( $# - 1 ))
COMP_LINE="$SHEAF_TEST_LINE"
COMP_POINT=${#COMP_LINE}
_sheaf sheaf "${COMP_WORDS[COMP_CWORD]}" "${COMP_WORDS[COMP_CWORD-1]}" || exit 99
printf '%s\n' "${COMPREPLY[@]}"
"#;
    let o = run_cmd(
        Command::new("bash")
            .arg("-c")
            .arg(prog)
            .arg("bash")
            .arg(script)
            .args(words)
            .current_dir(cwd)
            .env("SHEAF_TEST_LINE", line)
            .env("PATH", path_with_sheaf())
            .stdin(Stdio::null()),
    )
    .ok();
    // Outside a real completion, compopt says so; nothing else may be said.
    let noise: Vec<&str> = o
        .err_lines()
        .into_iter()
        .filter(|l| !l.contains("compopt: not currently executing completion function"))
        .collect();
    assert!(noise.is_empty(), "completing {words:?}:\n{}", o.describe());
    let mut v: Vec<String> = o
        .text()
        .lines()
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect();
    v.sort();
    v
}

#[test]
fn bash_completes_commands_options_and_image_paths() {
    if !prerequisite(
        Path::new(BASH_COMPLETION).is_file(),
        "bash-completion (Debian package bash-completion)",
    ) {
        return;
    }
    let t = tmpdir();
    // Through the small `sheaf`, which hands the command to sheaf-full.
    let o = sheaf(["completions", "bash"]).ok();
    assert!(o.stderr.is_empty(), "{}", o.describe());
    let script = t.path().join("sheaf.bash");
    fs::write(&script, &o.stdout).unwrap();
    let d = t.path().join("work");
    fs::create_dir_all(d.join("alps")).unwrap();
    for f in ["alpha.sheaf", "al pine.sheaf", "beta.txt"] {
        fs::write(d.join(f), b"x").unwrap();
    }
    let c = |w: &[&str]| complete(&script, &d, w);
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();

    assert_eq!(c(&["sheaf", "mo"]), s(&["mount"]));
    assert_eq!(c(&["sheaf", "pool", "lo"]), s(&["load"]));
    assert_eq!(c(&["sheaf", "info", "--js"]), s(&["--json"]));
    assert_eq!(c(&["sheaf", "completions", "z"]), s(&["zsh"]));
    // The hidden command is not offered.
    assert!(c(&["sheaf", "ma"]).is_empty());
    // An image: files (and directories on the way), names with spaces whole.
    assert_eq!(
        c(&["sheaf", "info", "al"]),
        s(&["al pine.sheaf", "alpha.sheaf", "alps"])
    );
    let abs = format!("{}/alp", d.display());
    assert_eq!(
        c(&["sheaf", "info", &abs]),
        vec![
            format!("{}/alpha.sheaf", d.display()),
            format!("{}/alps", d.display())
        ]
    );
    // An empty word where an image goes: files, not the options.
    assert_eq!(
        c(&["sheaf", "check", ""]),
        s(&["al pine.sheaf", "alpha.sheaf", "alps", "beta.txt"])
    );
    // Later positionals and a mount's images too.
    assert_eq!(
        c(&["sheaf", "mount", "alpha.sheaf", "al"]),
        s(&["al pine.sheaf", "alpha.sheaf", "alps"])
    );
    // Where only a directory fits (value hint DirPath): directories only.
    assert_eq!(c(&["sheaf", "stats", "al"]), s(&["alps"]));
    assert_eq!(
        c(&["sheaf", "extract", "alpha.sheaf", "-C", "al"]),
        s(&["alps"])
    );
    // An option's file value.
    assert_eq!(
        c(&["sheaf", "build", "src", "-o", "al"]),
        s(&["al pine.sheaf", "alpha.sheaf", "alps"])
    );
}

/// PATH with the directory of the `sheaf` under test first.
fn path_with_sheaf() -> std::ffi::OsString {
    let dir = Path::new(bin()).parent().unwrap().to_path_buf();
    let rest = std::env::var_os("PATH").unwrap_or_default();
    std::env::join_paths(std::iter::once(dir).chain(std::env::split_paths(&rest))).unwrap()
}

/// `sheaf mount -o` completes the option names the parser takes, after
/// commas and `=` as bash splits them, and the values of those with a few;
/// cat, ls, du, find and extract complete paths inside the image (a stack's
/// merged tree), listed here from the directory the image was built from.
#[test]
fn bash_completes_mount_options_and_paths_inside_images() {
    if !prerequisite(
        Path::new(BASH_COMPLETION).is_file(),
        "bash-completion (Debian package bash-completion)",
    ) {
        return;
    }
    let t = tmpdir();
    let script = t.path().join("sheaf.bash");
    fs::write(&script, sheaf(["completions", "bash"]).ok().stdout).unwrap();
    let d = t.path().join("work");
    fs::create_dir_all(&d).unwrap();
    let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
    let c = |line: &str, w: &[&str]| complete_line(&script, &d, line, w);

    // -o: names (a value-taking one with its '='), after a comma too.
    assert_eq!(
        c("sheaf mount -o allow_", &["sheaf", "mount", "-o", "allow_"]),
        s(&["allow_other", "allow_root"])
    );
    assert_eq!(
        c("sheaf mount -o re", &["sheaf", "mount", "-o", "re"]),
        s(&["readahead=", "readdirplus=", "record="])
    );
    assert_eq!(
        c(
            "sheaf mount -o noexec,mem_c",
            &["sheaf", "mount", "-o", "noexec,mem_c"]
        ),
        s(&["noexec,mem_cache="])
    );
    // As bash splits the line at '=': the candidates continue the last word.
    assert_eq!(
        c(
            "sheaf mount -o mem_cache=1G,allow_o",
            &["sheaf", "mount", "-o", "mem_cache", "=", "1G,allow_o"]
        ),
        s(&["1G,allow_other"])
    );
    assert_eq!(
        c(
            "sheaf mount -o readdirplus=a",
            &["sheaf", "mount", "-o", "readdirplus", "=", "a"]
        ),
        s(&["always", "auto"])
    );
    assert_eq!(
        c(
            "sheaf mount -o io_uring=",
            &["sheaf", "mount", "-o", "io_uring", "=", ""]
        ),
        s(&["auto", "off"])
    );
    // Every name offered is one `sheaf mount --help` documents.
    let help = sheaf(["mount", "--help"]).ok().text();
    let documented: BTreeSet<&str> = help
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .collect();
    let offered = c("sheaf mount -o ", &["sheaf", "mount", "-o", ""]);
    assert!(offered.len() > 20, "{offered:?}");
    for name in offered {
        let key = name.trim_end_matches('=');
        assert!(
            documented.contains(key),
            "{key} is offered but not in mount --help"
        );
    }

    // Paths inside an image.
    let src = t.path().join("src");
    for f in [
        "notes.txt",
        "sub/x.txt",
        "sub/deeper/y",
        "with space/z",
        ".hidden",
    ] {
        fs::create_dir_all(src.join(f).parent().unwrap()).unwrap();
        write(&src.join(f), b"x");
    }
    let img = d.join("img.sheaf");
    sheaf([
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
    ])
    .ok();
    // What the directory holds, as bash would insert it.
    let listed = |dir: &str, start: &str| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(src.join(dir))
            .unwrap()
            .map(|e| e.unwrap())
            .map(|e| {
                let n = e.file_name().into_string().unwrap();
                let slash = if e.file_type().unwrap().is_dir() {
                    "/"
                } else {
                    ""
                };
                format!("{dir}{}{slash}", n.replace(' ', "\\ "))
            })
            .filter(|p| p.starts_with(&format!("{dir}{start}")))
            .filter(|p| start.starts_with('.') || !p[dir.len()..].starts_with('.'))
            .collect();
        v.sort();
        v
    };
    assert_eq!(listed("", "").len(), 3, "{:?}", listed("", ""));
    assert_eq!(
        c("sheaf cat img.sheaf ", &["sheaf", "cat", "img.sheaf", ""]),
        listed("", "")
    );
    assert_eq!(
        c(
            "sheaf cat img.sheaf su",
            &["sheaf", "cat", "img.sheaf", "su"]
        ),
        listed("", "su")
    );
    assert_eq!(
        c(
            "sheaf cat img.sheaf notes.txt sub/",
            &["sheaf", "cat", "img.sheaf", "notes.txt", "sub/"]
        ),
        listed("sub/", "")
    );
    assert_eq!(
        c(
            "sheaf ls -l img.sheaf .",
            &["sheaf", "ls", "-l", "img.sheaf", "."]
        ),
        listed("", ".")
    );
    assert_eq!(
        c(
            "sheaf du -d 1 img.sheaf w",
            &["sheaf", "du", "-d", "1", "img.sheaf", "w"]
        ),
        listed("", "w")
    );
    assert_eq!(
        c(
            "sheaf find img.sheaf sub/d",
            &["sheaf", "find", "img.sheaf", "sub/d"]
        ),
        listed("sub/", "d")
    );
    assert_eq!(
        c(
            "sheaf extract -C out img.sheaf sub/x",
            &["sheaf", "extract", "-C", "out", "img.sheaf", "sub/x"]
        ),
        listed("sub/", "x")
    );
    // The image itself is still a local file; ls takes one path: after
    // it, local files again.
    assert_eq!(
        c("sheaf cat im", &["sheaf", "cat", "im"]),
        s(&["img.sheaf"])
    );
    assert_eq!(
        c(
            "sheaf ls img.sheaf sub i",
            &["sheaf", "ls", "img.sheaf", "sub", "i"]
        ),
        s(&["img.sheaf"])
    );
    // A quoted image name with a space, and a stack's merged tree (the
    // top layer hides notes.txt and adds sub/new).
    fs::copy(&img, d.join("my img.sheaf")).unwrap();
    // An existing file whose name holds a comma is one image, not a stack.
    fs::copy(&img, d.join("v1,v2.sheaf")).unwrap();
    assert_eq!(
        c(
            "sheaf ls v1,v2.sheaf su",
            &["sheaf", "ls", "v1,v2.sheaf", "su"]
        ),
        listed("", "su")
    );
    let top = t.path().join("top");
    fs::create_dir_all(top.join("sub")).unwrap();
    write(&top.join(".wh.notes.txt"), b"");
    write(&top.join("sub/new"), b"x");
    sheaf([
        "build".as_ref(),
        top.as_os_str(),
        "-o".as_ref(),
        d.join("top.sheaf").as_os_str(),
    ])
    .ok();
    assert_eq!(
        c(
            "sheaf cat my\\ img.sheaf sub/",
            &["sheaf", "cat", "my\\ img.sheaf", "sub/"]
        ),
        listed("sub/", "")
    );
    assert_eq!(
        c(
            "sheaf cat 'my img.sheaf',top.sheaf ",
            &["sheaf", "cat", "'my img.sheaf',top.sheaf", ""]
        ),
        s(&["sub/", "with\\ space/"])
    );
    assert_eq!(
        c(
            "sheaf cat img.sheaf,top.sheaf sub/",
            &["sheaf", "cat", "img.sheaf,top.sheaf", "sub/"]
        ),
        s(&["sub/deeper/", "sub/new", "sub/x.txt"])
    );
}

#[test]
fn completions_for_each_shell_and_a_one_line_error_for_others() {
    let zsh = sheaf_in(["completions", "zsh"]).ok().text();
    assert!(
        zsh.starts_with("#compdef sheaf"),
        "{}",
        &zsh[..zsh.len().min(200)]
    );
    assert!(
        zsh.contains("_files") && zsh.contains("'mount:"),
        "zsh: no files or commands"
    );
    let fish = sheaf_in(["completions", "fish"]).ok().text();
    assert!(
        fish.contains("complete -c sheaf") && fish.contains("-a \"mount\""),
        "fish"
    );
    let bash = sheaf_in(["completions", "bash"]).ok().text();
    assert!(bash.contains("complete -F _sheaf") && bash.contains("_sheaf()"));
    // `sheaf mount -o`: zsh's _values and fish's list offer the options.
    let zsh_o = zsh
        .lines()
        .find(|l| l.contains("-o+[Mount options"))
        .expect("zsh: mount -o");
    assert!(
        zsh_o.contains(":OPTS:_values -s , ")
            && zsh_o.contains("\"allow_other\"")
            && zsh_o.contains("\"readdirplus:value:(auto always never)\""),
        "{zsh_o}"
    );
    let fish_o = fish
        .lines()
        .find(|l| l.contains("mount\" -s o "))
        .expect("fish: mount -o");
    assert!(fish_o.contains("__fish_complete_list , __fish_sheaf_mount_options"));
    assert!(fish.contains("function __fish_sheaf_mount_options") && fish.contains(" allow_other "));
    for (sh, text) in [("zsh", &zsh), ("fish", &fish), ("bash", &bash)] {
        if on_path(sh) {
            let f = tmpdir();
            let p = f.path().join("script");
            fs::write(&p, text).unwrap();
            run_cmd(Command::new(sh).arg("-n").arg(&p)).ok();
        }
    }
    let o = sheaf_in(["completions", "tcsh"]).fails_with(2);
    let l = o.one_err_line();
    assert!(
        l.contains("'tcsh'") && l.contains("bash, zsh, fish"),
        "the error names the shell and the valid ones: {l}"
    );
    assert!(o.stdout.is_empty());
}

/// Runs `dpkg -P sheaf` when dropped, so that a failing test leaves no
/// package behind.
struct Purge;

impl Drop for Purge {
    fn drop(&mut self) {
        let _ = Command::new("dpkg")
            .args(["-P", "sheaf"])
            .stdin(Stdio::null())
            .output();
    }
}

/// Whether dpkg has a sheaf package installed (status `install ok installed`).
fn package_installed() -> bool {
    let o = run_cmd(Command::new("dpkg-query").args(["-W", "-f=${Status}", "sheaf"]));
    o.code == 0 && o.text().split_whitespace().last() == Some("installed")
}

/// What the package installs outside /usr/share, as `dpkg -i` puts it.
const INSTALLED: [&str; 4] = [
    "/usr/bin/sheaf",
    "/usr/libexec/sheaf",
    "/sbin/mount.fuse.sheaf",
    "/etc/systemd/system/sheaf-snapshotter.service",
];

#[test]
fn make_deb_builds_a_package_that_installs_and_removes_cleanly() {
    if !prerequisite(
        on_path("dpkg-deb") && on_path("make"),
        "dpkg-deb and make (Debian packages dpkg, make)",
    ) {
        return;
    }
    let t = tmpdir();
    let out = t.path().join("deb");
    // scripts/deb.sh with the binaries under test, not a new build.
    let o = run_cmd(
        Command::new("bash")
            .arg("scripts/deb.sh")
            .arg(&out)
            .env("SHEAF", bin())
            .env_remove("MAKEFLAGS")
            .env_remove("MFLAGS")
            .current_dir(repo_root())
            .stdin(Stdio::null()),
    )
    .ok();
    let version = sheaf(["--version"]).ok().text();
    let version = version
        .split_whitespace()
        .nth(1)
        .expect("sheaf VERSION")
        .to_string();
    let arch = run_cmd(Command::new("dpkg").arg("--print-architecture"))
        .ok()
        .text()
        .trim()
        .to_string();
    let deb = out.join(format!("sheaf_{version}_{arch}.deb"));
    assert_eq!(
        o.text().trim(),
        deb.display().to_string(),
        "{}",
        o.describe()
    );
    assert!(deb.is_file());

    let contents = run_cmd(Command::new("dpkg-deb").arg("--contents").arg(&deb))
        .ok()
        .text();
    let paths: BTreeSet<&str> = contents
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .collect();
    for p in [
        "./usr/bin/sheaf",
        "./usr/libexec/sheaf/sheaf-full",
        "./sbin/mount.fuse.sheaf",
        "./etc/systemd/system/sheaf-snapshotter.service",
        "./usr/share/man/man1/sheaf.1.gz",
        "./usr/share/man/man1/sheaf-mount.1.gz",
        "./usr/share/man/man1/sheaf-pool-load.1.gz",
        "./usr/share/man/man8/sheaf-slurm.8.gz",
        "./usr/share/bash-completion/completions/sheaf",
        "./usr/share/zsh/site-functions/_sheaf",
        "./usr/share/fish/vendor_completions.d/sheaf.fish",
        "./usr/share/doc/sheaf/copyright",
    ] {
        assert!(paths.contains(p), "{p} not in the package:\n{contents}");
    }
    // The Slurm plugin, built by `make build` where Slurm's header is
    // (docs/slurm.md).
    if Path::new("/usr/include/slurm/spank.h").exists() {
        assert!(
            paths.contains("./usr/lib/sheaf/sheaf_spank.so"),
            "the Slurm plugin is not in the package (make spank builds it beside {}):\n{contents}",
            bin()
        );
    }
    assert!(
        contents
            .lines()
            .any(|l| l.ends_with("./sbin/mount.fuse.sheaf -> /usr/bin/sheaf")),
        "mount.fuse.sheaf is a link to /usr/bin/sheaf:\n{contents}"
    );
    let info = run_cmd(Command::new("dpkg-deb").arg("--info").arg(&deb))
        .ok()
        .text();
    let depends = info
        .lines()
        .find_map(|l| l.trim().strip_prefix("Depends: "))
        .unwrap_or_else(|| panic!("no Depends:\n{info}"));
    let deps: Vec<&str> = depends
        .split(',')
        .map(|d| d.split_whitespace().next().unwrap_or(""))
        .collect();
    for d in ["fuse3", "libc6"] {
        assert!(deps.contains(&d), "Depends lacks {d}: {depends}");
    }
    assert!(info.contains(&format!("Version: {version}")), "{info}");
    assert!(
        info.contains("conffiles"),
        "the unit is a conffile:\n{info}"
    );

    // A real install, as root, outside the fast tier (it changes the system).
    if check_tier() || !is_root() {
        eprintln!("not installing the package: needs root outside the check tier");
        return;
    }
    assert!(
        !package_installed(),
        "a sheaf package is already installed here; not touching it"
    );
    for p in INSTALLED {
        assert!(
            fs::symlink_metadata(p).is_err(),
            "{p} exists (an earlier `make install` with PREFIX=/usr?); not overwriting it"
        );
    }
    let _purge = Purge;
    run_cmd(
        Command::new("dpkg")
            .arg("-i")
            .arg(&deb)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null()),
    )
    .ok();
    let sys = |args: &[&std::ffi::OsStr]| {
        run_cmd(
            Command::new("/usr/bin/sheaf")
                .args(args)
                .env_remove("SOURCE_DATE_EPOCH")
                .env("SHEAF_CACHE_DIR", t.path().join("cache"))
                .stdin(Stdio::null()),
        )
    };
    let v = sys(&["--version".as_ref()]).ok().text();
    assert!(v.starts_with(&format!("sheaf {version}")), "{v}");
    let src = t.path().join("tree");
    small_tree(&src, 7);
    let img = t.path().join("tree.sheaf");
    sys(&[
        "build".as_ref(),
        src.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
    ])
    .ok();
    let cat = sys(&["cat".as_ref(), img.as_os_str(), "docs/b.txt".as_ref()]).ok();
    assert_eq!(cat.stdout, fs::read(src.join("docs/b.txt")).unwrap());
    // man finds the installed pages by name, bash-completion loads the script
    // on demand from its standard place.
    // (unless this system's dpkg excludes man pages, as slim images do)
    if on_path("man") && Path::new("/usr/share/man/man1/sheaf-pool-load.1.gz").exists() {
        let w = run_cmd(Command::new("man").args(["-w", "sheaf-pool-load"])).ok();
        assert_eq!(w.text().trim(), "/usr/share/man/man1/sheaf-pool-load.1.gz");
    }
    if Path::new(BASH_COMPLETION).is_file() {
        let o = run_cmd(Command::new("bash").arg("-c").arg(format!(
            "source {BASH_COMPLETION}; __load_completion sheaf && complete -p sheaf"
        )))
        .ok();
        assert!(o.text().contains("-F _sheaf"), "{}", o.describe());
    }

    run_cmd(
        Command::new("dpkg")
            .args(["-P", "sheaf"])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .stdin(Stdio::null()),
    )
    .ok();
    for p in INSTALLED.iter().chain(&[
        "/usr/share/man/man1/sheaf.1.gz",
        "/usr/share/bash-completion/completions/sheaf",
    ]) {
        assert!(fs::symlink_metadata(p).is_err(), "{p} left after dpkg -P");
    }
    assert!(!package_installed(), "dpkg still has sheaf installed");
}
