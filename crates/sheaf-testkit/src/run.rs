//! The `sheaf` command run in-process.

use std::ffi::{OsStr, OsString};

/// What one in-process run of `sheaf` gave.
#[derive(Debug)]
pub struct Out {
    /// Its exit code.
    pub code: i32,
    /// What it wrote to standard output.
    pub stdout: Vec<u8>,
    /// What it wrote to standard error (lossy UTF-8).
    pub stderr: String,
    /// The command line, for messages.
    pub what: String,
}

impl Out {
    /// stdout as (lossy) text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// Non-empty lines of stderr.
    pub fn err_lines(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| !l.trim().is_empty())
            .collect()
    }

    /// Panic with the whole run unless the exit code is 0.
    #[track_caller]
    pub fn ok(self) -> Self {
        assert_eq!(self.code, 0, "{} failed:\n{}", self.what, self.describe());
        self
    }

    /// Panic with the whole run unless it exited with `code`.
    #[track_caller]
    pub fn fails_with(self, code: i32) -> Self {
        assert_eq!(
            self.code,
            code,
            "{}: wrong exit code:\n{}",
            self.what,
            self.describe()
        );
        self
    }

    /// The one line on stderr, panicking unless there is exactly one.
    #[track_caller]
    pub fn one_err_line(&self) -> &str {
        let l = self.err_lines();
        assert_eq!(
            l.len(),
            1,
            "{}: expected exactly one stderr line:\n{}",
            self.what,
            self.describe()
        );
        l[0]
    }

    /// Panic if the command panicked or was killed (code 101 or a signal).
    #[track_caller]
    pub fn no_panic(&self) -> &Self {
        assert!(
            self.code != 101 && self.code >= 0 && !self.stderr.contains("panicked at"),
            "{}: panicked or was killed:\n{}",
            self.what,
            self.describe()
        );
        self
    }

    /// The run, for a failure message.
    pub fn describe(&self) -> String {
        let so = self.text();
        let so = if so.len() > 2000 {
            format!("{}...", so.chars().take(2000).collect::<String>())
        } else {
            so
        };
        format!(
            "  exit code: {}\n  stderr: {}\n  stdout: {}",
            self.code, self.stderr, so
        )
    }
}

/// Run `sheaf ARGS...` in this process (`sheaf_cli::run`), with this
/// process's environment and working directory, and collect its exit code
/// and output. Only for the commands that write through `sheaf_cli::Io`
/// ([`sheaf_cli::IO_COMMANDS`]; any other panics here: it would print to
/// the test's own streams), and usage errors, help and version; a command
/// that needs a process of its own (mount, run, a signal, its own
/// environment or standard input) is spawned instead. `SOURCE_DATE_EPOCH`
/// must be unset (a spawned `sheaf` gets it removed; this process's
/// environment is what an in-process build sees).
pub fn sheaf<I, S>(args: I) -> Out
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let argv: Vec<OsString> = std::iter::once(OsString::from("sheaf"))
        .chain(args.into_iter().map(|a| a.as_ref().to_os_string()))
        .collect();
    let what = format!("sheaf (in-process) {:?}", &argv[1..]);
    if let Some(c) = argv[1..]
        .iter()
        .find(|a| !a.to_string_lossy().starts_with('-'))
    {
        assert!(
            sheaf_cli::IO_COMMANDS.contains(&&*c.to_string_lossy()),
            "{what}: `sheaf {}` does not write through sheaf_cli::Io: spawn it",
            c.to_string_lossy()
        );
    }
    assert!(
        std::env::var_os("SOURCE_DATE_EPOCH").is_none(),
        "{what}: SOURCE_DATE_EPOCH is set in the test's environment, which an in-process build would obey: unset it"
    );
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let code = sheaf_cli::run(argv, &mut sheaf_cli::Io::new(&mut stdout, &mut stderr));
    Out {
        code,
        stdout,
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
        what,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_in_process_gives_the_code_and_output_a_process_would() {
        let t = tempfile::tempdir().unwrap();
        let img = crate::image(t.path(), "i", &[("d/a.txt", "alpha\n"), ("b", "beta")]);
        let img = img.as_os_str();
        let o = sheaf([OsStr::new("cat"), img, "d/a.txt".as_ref(), "b".as_ref()]).ok();
        assert_eq!(o.stdout, b"alpha\nbeta");
        assert_eq!(o.stderr, "");
        let o = sheaf([OsStr::new("cat"), img, "nope".as_ref()]).fails_with(1);
        assert_eq!(o.stdout, b"");
        assert_eq!(
            o.one_err_line(),
            "sheaf: error: nope: no such file or directory in the image"
        );
        // A usage error: code 2 and one line naming the help to read.
        let o = sheaf(["du"]).fails_with(2);
        assert_eq!(
            o.one_err_line(),
            "sheaf: the following required arguments were not provided: <IMAGE> (see 'sheaf du --help')"
        );
        // --version and help go to stdout, code 0.
        let o = sheaf(["--version"]).ok();
        assert!(o.text().starts_with("sheaf 0."), "{}", o.text());
        // (help CMD is the command's manual page, as man shows it.)
        let o = sheaf(["help", "ls"]).ok();
        let page = o.text();
        assert!(
            page.contains("SYNOPSIS") && page.contains("sheaf ls"),
            "{}",
            o.describe()
        );
        assert_eq!(o.stderr, "");
    }

    #[test]
    #[should_panic(expected = "does not write through sheaf_cli::Io")]
    fn a_command_that_prints_to_the_process_is_refused() {
        sheaf(["run", "-m", "/nonexistent:/x", "--", "true"]);
    }
}
