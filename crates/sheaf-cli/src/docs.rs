//! Man pages and shell completion scripts, made from the same clap
//! definitions as `--help` (clap_mangen, clap_complete): `sheaf completions
//! SHELL` and the hidden `sheaf man --dir DIR` that `make install` runs.

use crate::options::OptionValue;
use anyhow::{bail, Context, Result};
use clap::{Command, ValueHint};
use std::io::Write;
use std::path::Path;

/// The shells `sheaf completions` writes scripts for.
pub const SHELLS: [&str; 3] = ["bash", "zsh", "fish"];

/// The name the scripts complete and the man pages are named after.
const BIN: &str = "sheaf";

/// `sheaf completions SHELL`: the script on standard output.
pub fn completions(cmd: Command, shell: &str, io: &mut crate::Io<'_>) -> Result<i32> {
    let script = completion_script(cmd, shell)?;
    io.stdout
        .write_all(script.as_bytes())
        .and_then(|()| io.stdout.flush())
        .context("writing the completion script")?;
    Ok(0)
}

/// The completion script for `shell` (one of [`SHELLS`]).
pub fn completion_script(mut cmd: Command, shell: &str) -> Result<String> {
    use clap_complete::Shell;
    let sh = match shell {
        "bash" => Shell::Bash,
        "zsh" => Shell::Zsh,
        "fish" => Shell::Fish,
        other => bail!(
            "completions: unknown shell '{other}': one of {}",
            SHELLS.join(", ")
        ),
    };
    cmd = without_hidden_commands(cmd);
    if sh == Shell::Bash {
        cmd = any_path_as_file(cmd);
    }
    let mut buf = Vec::new();
    clap_complete::generate(sh, &mut cmd, BIN, &mut buf);
    let script = String::from_utf8(buf).context("clap_complete wrote a non-UTF-8 script")?;
    match sh {
        Shell::Bash => bash_with_paths(&cmd, script),
        Shell::Zsh => zsh_with_mount_options(script),
        _ => fish_with_mount_options(script),
    }
}

/// The one line of a zsh or fish script that completes `sheaf mount -o`,
/// found by the option's help text: (its start, its end).
fn mount_o_line(script: &str, marker: &str) -> Result<(usize, usize)> {
    let mut found = script.match_indices(marker).filter(|(at, _)| {
        let start = script[..*at].rfind('\n').map_or(0, |k| k + 1);
        let line = &script[start..];
        let line = &line[..line.find('\n').unwrap_or(line.len())];
        line.contains("Mount options")
    });
    let (Some((at, _)), None) = (found.next(), found.next()) else {
        bail!("clap_complete's script changed shape: cannot add mount option completion");
    };
    let start = script[..at].rfind('\n').map_or(0, |k| k + 1);
    let end = script[at..].find('\n').map_or(script.len(), |k| at + k);
    Ok((start, end))
}

/// zsh: `sheaf mount -o` completes the option names, comma-separated, and
/// the values of those that take one of a few words (zsh's `_values`).
fn zsh_with_mount_options(script: String) -> Result<String> {
    let (start, end) = mount_o_line(&script, ":OPTS:_default'")?;
    let specs: Vec<String> = crate::options::OFFERED
        .iter()
        .map(|(n, v)| match v {
            OptionValue::Switch => format!("\"{n}\""),
            OptionValue::Any => format!("\"{n}:value: \""),
            OptionValue::OneOf(w) => format!("\"{n}:value:({})\"", w.join(" ")),
        })
        .collect();
    let line = script[start..end].replacen(
        ":OPTS:_default'",
        &format!(":OPTS:_values -s , \"mount option\" {}'", specs.join(" ")),
        1,
    );
    Ok(format!("{}{line}{}", &script[..start], &script[end..]))
}

/// fish: `sheaf mount -o` completes the option names, comma-separated
/// (fish's `__fish_complete_list`, as its own mount completion does).
fn fish_with_mount_options(script: String) -> Result<String> {
    let (start, end) = mount_o_line(&script, "__fish_sheaf_using_subcommand mount\" -s o ")?;
    let names: Vec<String> = crate::options::OFFERED
        .iter()
        .map(|(n, v)| match v {
            OptionValue::Switch => n.to_string(),
            _ => format!("{n}="),
        })
        .collect();
    let line = format!(
        "{} -f -a \"(__fish_complete_list , __fish_sheaf_mount_options)\"",
        &script[start..end]
    );
    Ok(format!(
        "{}{line}{}\n# Added by sheaf: the names `sheaf mount -o` takes.\nfunction __fish_sheaf_mount_options\n    printf '%s\\n' {}\nend\n",
        &script[..start],
        &script[end..],
        names.join(" ")
    ))
}

/// clap_complete's bash script offers only the options where a positional
/// argument goes (an empty word gets all of them, and a file name is left
/// to readline's `-o default`, unseen by anything that reads COMPREPLY),
/// and nothing for an option's directory (left to `-o plusdirs`). Its
/// function becomes `_sheaf__clap`, sharing the command it found with a
/// new `_sheaf` that completes paths in those places, files or only
/// directories as the arguments' value hints say.
fn bash_with_paths(cmd: &Command, script: String) -> Result<String> {
    const FN: &str = "_sheaf() {\n";
    const LOCALS: &str = "local i cur prev opts cmd\n";
    if script.matches(FN).count() != 1 || script.matches(LOCALS).count() != 1 {
        bail!("clap_complete's bash script changed shape: cannot add path completion");
    }
    let mut s =
        script
            .replacen(FN, "_sheaf__clap() {\n", 1)
            .replacen(LOCALS, "local i cur prev opts\n", 1);
    let mut k = PathArgs::default();
    k.collect(cmd, BIN);
    let arm = |names: &[String], what: &str| {
        if names.is_empty() {
            String::new()
        } else {
            format!("        {}) {what} ;;\n", names.join("|"))
        }
    };
    s.push_str(&format!(
        r#"
# Added by sheaf: paths where a positional argument goes (the function
# above offers only options there) and after an option that takes a
# directory, as their value hints say.
_sheaf() {{
    local cmd=""
    _sheaf__clap "$@"
    local cur="${{COMP_WORDS[COMP_CWORD]}}" prev="${{COMP_WORDS[COMP_CWORD-1]}}" w
    if [[ "${{BASH_VERSINFO[0]}}" -ge 4 ]]; then
        cur="$2"
        prev="$3"
    fi
    case "$cmd,$prev" in
{dir_opts}    esac
    if [[ "$cmd" == sheaf__subcmd__mount ]] && _sheaf__after_o; then
        _sheaf__mount_options
        return 0
    fi
    [[ "$cur" == -* ]] && return 0
    for w in "${{COMPREPLY[@]}}"; do
        [[ "$w" == -* ]] || return 0
    done
    case "$cmd" in
{image_paths}    esac
    case "$cmd" in
{files}{dirs}    esac
    return 0
}}

# The word being completed as typed, whole: bash splits `mem_cache=1G` at
# '=' (COMP_WORDBREAKS), the line does not.
_sheaf__typed() {{
    local line="${{COMP_LINE:0:COMP_POINT}}"
    REPLY="${{line##*[[:space:]]}}"
}}

# Whether the word being completed is the value of -o.
_sheaf__after_o() {{
    local line="${{COMP_LINE:0:COMP_POINT}}" typed before
    _sheaf__typed
    typed="$REPLY"
    before="${{line%"$typed"}}"
    before="${{before%"${{before##*[![:space:]]}}"}}"
    [[ "${{before##*[[:space:]]}}" == -o ]]
}}

# `sheaf mount -o LIST`: the option names, or an option's values after '='.
_sheaf__mount_options() {{
    local typed item head c
    _sheaf__typed
    typed="$REPLY"
    item="${{typed##*,}}"
    head="${{typed%"$item"}}"
    COMPREPLY=()
    # (option names and values hold no spaces: the words split as usual)
    local words=()
    if [[ "$item" == *=* ]]; then
        case "${{item%%=*}}" in
{option_values}        esac
        words=( $(compgen -P "$head${{item%%=*}}=" -W "${{words[*]}}" -- "${{item#*=}}") )
    else
        words=( $(compgen -P "$head" -W "{option_names}" -- "$item") )
    fi
    # Relative to the word bash completes (after its last '=' or ':').
    for c in "${{words[@]}}"; do
        COMPREPLY+=( "${{c:${{#typed}}-${{#cur}}}}" )
    done
    compopt -o nospace 2>/dev/null
}}

# Shell quoting taken off a word without expanding anything in it
# (backslashes, '...', "..."), and a leading ~/.
_sheaf__dequote() {{
    local s="$1" out="" c q="" i
    for (( i = 0; i < ${{#s}}; i++ )); do
        c="${{s:i:1}}"
        if [[ -z "$q" ]]; then
            case "$c" in
                \\) i=$(( i + 1 )); out+="${{s:i:1}}" ;;
                \'|\") q="$c" ;;
                *) out+="$c" ;;
            esac
        elif [[ "$c" == "$q" ]]; then
            q=""
        elif [[ "$q" == '"' && "$c" == \\ ]]; then
            i=$(( i + 1 ))
            out+="${{s:i:1}}"
        else
            out+="$c"
        fi
    done
    [[ "$out" == "~/"* ]] && out="$HOME/${{out#"~/"}}"
    REPLY="$out"
}}

# Paths inside the image named by the command's first positional argument
# (a local file or stack; `sheaf complete-image-path` lists them): for the
# arguments after it, or only the one right after it when $1 is "one".
# $2: the options of the command that take a value. Fails (to let files
# be completed) where no image path goes.
_sheaf__in_image() {{
    local i w n=0 img="" sub="${{cmd##*__}}" seen=""
    for (( i = 1; i < COMP_CWORD; i++ )); do
        w="${{COMP_WORDS[i]}}"
        if [[ -z "$seen" ]]; then
            [[ "$w" == "$sub" ]] && seen=1
            continue
        fi
        case "$w" in
            =) i=$(( i + 1 )) ;;
            -*) [[ " $2 " == *" $w "* && "${{COMP_WORDS[i+1]}}" != = ]] && i=$(( i + 1 )) ;;
            *) n=$(( n + 1 )); [[ $n == 1 ]] && img="$w" ;;
        esac
    done
    [[ -n "$img" && $n -ge 1 ]] || return 1
    [[ "$1" == one && $n -gt 1 ]] && return 1
    _sheaf__dequote "$img"
    img="$REPLY"
    [[ -e "$img" || -e "${{img%%,*}}" ]] || return 1
    _sheaf__dequote "$cur"
    local IFS=$'\n' c q
    COMPREPLY=()
    for c in $("${{COMP_WORDS[0]}}" complete-image-path -- "$img" "$REPLY" 2>/dev/null); do
        printf -v q %q "$c"
        COMPREPLY+=( "$q" )
    done
    [[ ${{#COMPREPLY[@]}} == 1 && "${{COMPREPLY[0]}}" == */ ]] && compopt -o nospace 2>/dev/null
    return 0
}}

_sheaf__paths() {{
    COMPREPLY=()
    if declare -F _filedir >/dev/null; then
        if [[ "$1" == d ]]; then _filedir -d; else _filedir; fi
    else
        local IFS=$'\n'
        COMPREPLY=( $(compgen -"$1" -- "$cur") )
        compopt -o filenames 2>/dev/null
    fi
}}
"#,
        dir_opts = arm(&k.dir_options, "_sheaf__paths d; return 0"),
        image_paths = k
            .image_paths
            .iter()
            .map(|(name, how, valued)| format!(
                "        {name}) _sheaf__in_image {how} \"{}\" && return 0 ;;\n",
                valued.join(" ")
            ))
            .collect::<String>(),
        option_names = crate::options::OFFERED
            .iter()
            .map(|(n, v)| match v {
                OptionValue::Switch => n.to_string(),
                _ => format!("{n}="),
            })
            .collect::<Vec<_>>()
            .join(" "),
        option_values = crate::options::OFFERED
            .iter()
            .filter_map(|(n, v)| match v {
                OptionValue::OneOf(words) =>
                    Some(format!("            {n}) words=({}) ;;\n", words.join(" "))),
                _ => None,
            })
            .collect::<String>(),
        files = arm(&k.files, "_sheaf__paths f"),
        dirs = arm(&k.dirs, "_sheaf__paths d"),
    ));
    Ok(s)
}

/// `cmd` without its hidden subcommands, which clap_complete would offer
/// (remade: a clap command cannot lose a subcommand). Only what completion
/// needs is kept: the options and the visible subcommands, whole.
fn without_hidden_commands(cmd: Command) -> Command {
    Command::new(BIN)
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(cmd.is_propagate_version_set())
        .args(cmd.get_arguments().cloned())
        .subcommands(cmd.get_subcommands().filter(|s| !s.is_hide_set()).cloned())
}

/// `cmd` with every argument hinted as a path of any kind (clap's default
/// for a PathBuf) hinted as a file path instead, for clap_complete's bash
/// script: it completes both the same way (files and directories) except
/// that only for a file path does it keep names with spaces whole.
fn any_path_as_file(cmd: Command) -> Command {
    cmd.mut_args(|a| {
        if a.get_value_hint() == ValueHint::AnyPath {
            a.value_hint(ValueHint::FilePath)
        } else {
            a
        }
    })
    .mut_subcommands(any_path_as_file)
}

/// Where the bash script completes paths itself, by the names its
/// generated part gives the commands (`sheaf__subcmd__pool__subcmd__load`).
#[derive(Default, Debug)]
struct PathArgs {
    /// Commands whose positional arguments take files (or paths of any kind).
    files: Vec<String>,
    /// Commands whose positional arguments take only directories.
    dirs: Vec<String>,
    /// `COMMAND,OPTION` for each option that takes a directory.
    dir_options: Vec<String>,
    /// Commands whose arguments after the image are paths inside it
    /// ([`IMAGE_PATHS`]): (name, "one" or "all", the flags that take a
    /// value, which the script skips with their values).
    image_paths: Vec<(String, &'static str, Vec<String>)>,
}

/// Commands whose arguments after the image name entries inside it: all of
/// them (cat, extract), or only the first (ls, du, find: then an expression).
const IMAGE_PATHS: [(&str, &str); 5] = [
    ("cat", "all"),
    ("extract", "all"),
    ("ls", "one"),
    ("du", "one"),
    ("find", "one"),
];

impl PathArgs {
    /// Add `cmd` (built, so that global options are in every subcommand),
    /// named `name`, and its subcommands.
    fn collect(&mut self, cmd: &Command, name: &str) {
        let hints: Vec<ValueHint> = cmd
            .get_positionals()
            .filter(|a| !a.is_hide_set())
            .map(|a| a.get_value_hint())
            .collect();
        if hints.iter().any(|h| {
            matches!(
                h,
                ValueHint::AnyPath | ValueHint::FilePath | ValueHint::ExecutablePath
            )
        }) {
            self.files.push(name.to_string());
        } else if hints.contains(&ValueHint::DirPath) {
            self.dirs.push(name.to_string());
        }
        let path = name
            .split("__subcmd__")
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        if let Some((_, how)) = IMAGE_PATHS.iter().find(|(c, _)| *c == path) {
            let valued = cmd
                .get_opts()
                .flat_map(|o| {
                    let longs = o.get_long_and_visible_aliases().unwrap_or_default();
                    let shorts = o.get_short_and_visible_aliases().unwrap_or_default();
                    longs
                        .into_iter()
                        .map(|l| format!("--{l}"))
                        .chain(shorts.into_iter().map(|c| format!("-{c}")))
                        .collect::<Vec<_>>()
                })
                .collect();
            self.image_paths.push((name.to_string(), how, valued));
        }
        for o in cmd.get_opts() {
            if o.get_value_hint() == ValueHint::DirPath && !o.is_hide_set() {
                let longs = o.get_long_and_visible_aliases().unwrap_or_default();
                let shorts = o.get_short_and_visible_aliases().unwrap_or_default();
                let flags = longs
                    .iter()
                    .map(|l| format!("--{l}"))
                    .chain(shorts.iter().map(|c| format!("-{c}")));
                self.dir_options
                    .extend(flags.map(|f| format!("{name},{f}")));
            }
        }
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            let n = format!(
                "{name}__subcmd__{}",
                sub.get_name().replace('-', "__subcmd__")
            );
            self.collect(sub, &n);
        }
    }
}

/// `sheaf complete-image-path IMAGE PREFIX` (hidden; the bash completion
/// script runs it on TAB): the entries of the image's directory that
/// PREFIX names (up to its last `/`) whose names start with the rest, one
/// path a line as PREFIX spells it, directories ending in `/`. A stack
/// lists its merged tree. Never the network on a key press: a URL lists
/// nothing; names holding a newline are left out.
pub fn complete_image_path(
    image: &Path,
    prefix: &std::ffi::OsStr,
    remote: &crate::util::RemoteArgs,
    io: &mut crate::Io<'_>,
) -> Result<i32> {
    use std::os::unix::ffi::OsStrExt;
    let layers = crate::util::stack_layers(image).unwrap_or_else(|| vec![image.to_path_buf()]);
    if layers
        .iter()
        .any(|l| sheaf_net::is_url(&l.to_string_lossy()))
    {
        return Ok(0);
    }
    let stack = crate::util::open_stack(&layers, remote)?;
    let p = prefix.as_bytes();
    let (dir, part) = match p.iter().rposition(|&b| b == b'/') {
        Some(k) => p.split_at(k + 1),
        None => (&b""[..], p),
    };
    let sheaf_read::Found::Dir(d) = stack.resolve(dir)? else {
        return Ok(0);
    };
    let mut out = Vec::new();
    for e in stack.read_dir(&d)? {
        let hidden = e.name.starts_with(b".") && !part.starts_with(b".");
        if !e.name.starts_with(part) || hidden || e.name.contains(&b'\n') {
            continue;
        }
        out.extend_from_slice(dir);
        out.extend_from_slice(&e.name);
        if e.file_type == sheaf_format::FileType::Directory {
            out.push(b'/');
        }
        out.push(b'\n');
    }
    io.stdout
        .write_all(&out)
        .and_then(|()| io.stdout.flush())
        .context("writing the paths")?;
    Ok(0)
}

/// `sheaf man --dir DIR`: write every man page into DIR (created if missing).
pub fn man(cmd: Command, dir: &Path) -> Result<i32> {
    std::fs::create_dir_all(dir).with_context(|| format!("{}", dir.display()))?;
    for (file, page) in man_pages(cmd)? {
        let p = dir.join(&file);
        std::fs::write(&p, page).with_context(|| format!("{}", p.display()))?;
    }
    Ok(0)
}

/// One man page (section 1) per command that `--help` shows, the hidden
/// ones and `help` left out: (file name, roff text), e.g. `sheaf.1`,
/// `sheaf-mount.1`, `sheaf-pool-load.1`.
pub fn man_pages(cmd: Command) -> Result<Vec<(String, Vec<u8>)>> {
    fn walk(cmd: &Command, out: &mut Vec<(String, Vec<u8>)>) -> Result<()> {
        out.push(man_page(cmd)?);
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
            walk(sub, out)?;
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&built_for_man(cmd), &mut out)?;
    Ok(out)
}

/// `cmd` as its man pages show it: named `sheaf`, without the `help`
/// subcommand, built (so that subcommands know their full names and have
/// the global options).
fn built_for_man(cmd: Command) -> Command {
    let mut cmd = cmd.name(BIN).bin_name(BIN).disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// The man page of one command of a [`built_for_man`] tree: (file name,
/// roff text).
fn man_page(cmd: &Command) -> Result<(String, Vec<u8>)> {
    let man = clap_mangen::Man::new(cmd.clone())
        .source(format!("{BIN} {}", env!("CARGO_PKG_VERSION")))
        .manual("sheaf manual");
    let mut page = Vec::new();
    man.render(&mut page)
        .with_context(|| format!("man page of {}", cmd.get_name()))?;
    Ok((man.get_filename(), page))
}

/// `sheaf help CMD [SUB...]`: the command's manual page, made from the
/// same definitions as the installed one, so nothing need be installed.
/// On a terminal, man(1) renders it (`man -l -`, through the user's
/// pager); into a pipe or a test's buffer, man's plain-text rendering;
/// without man(1), clap's long help (the same text without the layout).
/// An unknown command is a usage error: one line, exit 2.
pub fn help(cmd: Command, words: &[std::ffi::OsString], io: &mut crate::Io<'_>) -> Result<i32> {
    let mut cur = built_for_man(cmd);
    for (k, w) in words.iter().enumerate() {
        let found = w.to_str().and_then(|w| {
            cur.get_subcommands()
                .find(|s| !s.is_hide_set() && s.get_name() == w)
                .cloned()
        });
        let Some(sub) = found else {
            let parent = std::iter::once(BIN)
                .chain(words[..k].iter().filter_map(|w| w.to_str()))
                .collect::<Vec<_>>()
                .join(" ");
            let _ = writeln!(
                io.stderr,
                "sheaf: help: no command '{}' (see '{parent} --help')",
                w.to_string_lossy()
            );
            return Ok(2);
        };
        cur = sub;
    }
    let (_, page) = man_page(&cur)?;
    if io.stdout_is_tty() {
        // man(1) on the terminal itself, paged as the user's man pages are.
        io.stdout.flush().context("writing the manual page")?;
        if let Ok((true, _)) = run_man(&page, false) {
            return Ok(0);
        }
    } else if let Ok((true, text)) = run_man(&page, true) {
        io.stdout
            .write_all(&text)
            .and_then(|()| io.stdout.flush())
            .context("writing the manual page")?;
        return Ok(0);
    }
    // No man(1) (or it failed): the same text as clap renders it.
    write!(io.stdout, "{}", cur.render_long_help())
        .and_then(|()| io.stdout.flush())
        .context("writing the help")?;
    Ok(0)
}

/// Run `man -l -` on the roff `page`: whether it succeeded, and its output
/// when `capture` (plain text: man(1) drops the terminal's bold and
/// underline when its output is not a terminal, and pages only to one).
fn run_man(page: &[u8], capture: bool) -> std::io::Result<(bool, Vec<u8>)> {
    use std::process::{Command as Proc, Stdio};
    let mut c = Proc::new("man");
    c.args(["-l", "-"]).stdin(Stdio::piped());
    if capture {
        c.stdout(Stdio::piped())
            .stderr(Stdio::null())
            .env("MANPAGER", "cat")
            .env("PAGER", "cat");
    }
    let mut child = c.spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    // Written from a thread: man may write output before it has read all
    // of its input, and a full pipe either way would block both.
    let page = page.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&page));
    let out = child.wait_with_output()?;
    let wrote = writer.join().is_ok_and(|r| r.is_ok());
    Ok((out.status.success() && wrote, out.stdout))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cli() -> Command {
        crate::app::command()
    }

    /// The names the added bash function uses for the commands are the
    /// ones the generated part gives them.
    #[test]
    fn bash_names_the_commands_as_clap_complete_does() {
        let script = completion_script(cli(), "bash").unwrap();
        let mut cmd = any_path_as_file(cli());
        cmd.set_bin_name(BIN);
        cmd.build();
        let mut k = PathArgs::default();
        k.collect(&cmd, BIN);
        for n in [
            "sheaf__subcmd__info",
            "sheaf__subcmd__pool__subcmd__publish",
        ] {
            assert!(k.files.iter().any(|f| f == n), "{n}: {k:?}");
        }
        for n in [
            "sheaf__subcmd__stats",
            "sheaf__subcmd__commit",
            "sheaf__subcmd__pool__subcmd__init",
        ] {
            assert!(k.dirs.iter().any(|f| f == n), "{n}: {k:?}");
        }
        assert!(
            k.dir_options
                .iter()
                .any(|o| o == "sheaf__subcmd__extract,-C"),
            "{k:?}"
        );
        let names = k.files.iter().chain(&k.dirs).cloned().chain(
            k.dir_options
                .iter()
                .map(|o| o.split(',').next().unwrap().to_string()),
        );
        for n in names {
            assert!(
                script.contains(&format!("cmd=\"{n}\"")),
                "{n} is not a name in the script"
            );
        }
    }

    #[test]
    fn man_pages_are_named_after_their_commands() {
        let pages = man_pages(cli()).unwrap();
        let names: Vec<&str> = pages.iter().map(|p| p.0.as_str()).collect();
        for n in [
            "sheaf.1",
            "sheaf-mount.1",
            "sheaf-pool-load.1",
            "sheaf-cache-gc.1",
        ] {
            assert!(names.contains(&n), "{n}: {names:?}");
        }
        assert!(!names
            .iter()
            .any(|n| n.starts_with("sheaf-man") || n.contains("help")));
        let load = String::from_utf8(
            pages
                .iter()
                .find(|p| p.0 == "sheaf-pool-load.1")
                .unwrap()
                .1
                .clone(),
        )
        .unwrap();
        assert!(
            load.starts_with(".ie") && load.contains(".TH sheaf-pool-load 1"),
            "{load}"
        );
    }

    #[test]
    fn an_unknown_shell_is_refused_naming_the_known_ones() {
        let e = completion_script(cli(), "tcsh").unwrap_err().to_string();
        assert_eq!(
            e,
            "completions: unknown shell 'tcsh': one of bash, zsh, fish"
        );
    }
}
