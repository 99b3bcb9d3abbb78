//! The whole `sheaf` command as a function: [`run`] parses the arguments,
//! runs the command and returns its exit code, writing through an [`Io`]
//! (the process's streams for `sheaf-full`, buffers in tests). Every failure
//! becomes one line on stderr (`sheaf: error: ...`) and a non-zero exit.

use crate::*;

use clap::{Parser, Subcommand};
use std::io::Write;
use std::path::PathBuf;

/// Pack directory trees into compressed, verifiable, read-only images.
///
/// An image holds files, directories, symlinks, hardlinks, devices, owners,
/// modes, nanosecond mtimes and xattrs. Data is split into hashed blocks
/// (BLAKE3), deduplicated and compressed; metadata is paged so that a reader
/// touches only what it needs. Every byte read is checked against its hash.
///
/// Commands that read an image take a local file or an http(s):// URL (read
/// with Range requests from any static web server, fetching only what is
/// needed). Images can be signed with OpenSSH keys and mounted without root.
#[cfg(feature = "mpi")]
const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), " (with MPI)");
#[cfg(not(feature = "mpi"))]
const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (without MPI: sheaf bcast copies locally only)"
);

const ABOUT: &str =
    "sheaf: pack a directory tree into one compressed, verifiable, read-only image; \
list, read, mount, run and share it without unpacking";

const AFTER_HELP: &str = "\
Most used:
  sheaf build DIR -o data.sheaf        pack a tree (or a tar stream: -)
  sheaf ls -l data.sheaf some/dir      list, as ls does; also cat, find, du, info
  sheaf mount data.sheaf /mnt/data     mount without root (sheaf umount /mnt/data)
  sheaf run -m data.sheaf:/data -- CMD run a command that sees the image at /data
  sheaf extract data.sheaf -C DIR      unpack

Images are files, http(s)://, ssh:// or s3:// URLs (fetched lazily into a
node cache) or published repositories; ls, cat, find, du, info, mount, run and
merge also take stacks BASE,LAYER (later layers win). The flags under
'Remote images (URLs)' apply to every command that reads a URL ('sheaf help
remote' says more).
'sheaf COMMAND --help' explains each command; 'sheaf help COMMAND' shows its
manual page, installed or not ('man sheaf-COMMAND' once installed).";

const REMOTE_ABOUT: &str = "\
How remote images are reached and cached. Every command that reads an image
(ls, cat, find, du, info, check, extract, mount, run, pool load, bcast...)
takes these flags; only the pages and blocks a command touches are fetched,
each checked against its digest before use.";

const REMOTE_AFTER_HELP: &str = "\
Image forms:
  data.sheaf                       a file
  https://host/data.sheaf          a whole image on any web server or S3-style
                                   store (Range requests)
  https://host/repo/data           a repository that `sheaf publish` wrote
                                   (whole objects named by digest; proxies cache them)
  ssh://user@host/path/data.sheaf  over SFTP, with your OpenSSH keys and agent
  s3://bucket/key                  object storage, either form (AWS_* variables,
                                   ~/.aws; AWS_ENDPOINT_URL for other stores)
  BASE,LAYER                       a stack (ls, cat, find, du, info, mount, run, merge)

Credentials in URLs (user:password@, signed query parameters) never appear
in /proc/mounts, errors or `sheaf stats`.

Examples:
  sheaf ls https://host/data.sheaf sub/dir
  sheaf mount --mirror https://b/data.sheaf https://a/data.sheaf /mnt/data
  SHEAF_PROXY='http://squid:3128;DIRECT' sheaf cat https://host/repo/data README

More: docs/remote.md, 'man sheaf'.";

/// `sheaf help remote`: the remote flags with what they are for.
pub(crate) fn remote_help() -> clap::Command {
    use clap::Args;
    util::RemoteArgs::augment_args(clap::Command::new("sheaf help remote"))
        .about(REMOTE_ABOUT)
        .override_usage("sheaf COMMAND [REMOTE FLAGS] [ARGS]...")
        .disable_help_flag(true)
        .disable_version_flag(true)
        .after_help(REMOTE_AFTER_HELP)
}

#[derive(Parser, Debug)]
#[command(
    name = "sheaf",
    version = VERSION,
    propagate_version = true,
    about = ABOUT,
    long_about = None,
    after_help = AFTER_HELP
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    #[command(flatten)]
    remote: util::RemoteArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Pack a directory or tar archive into an image.
    Build(build::BuildArgs),
    /// Copy an image to a node-local path on every node of a job (under
    /// mpirun or srun), reading it from shared storage once and sending
    /// each node only the objects it lacks.
    Bcast(bcast::BcastArgs),
    /// Import a container image (registry, OCI layout, docker save archive)
    /// as sheaf layers in a repository, or as one merged image.
    Import(import::ImportArgs),
    /// Serve containerd's snapshots API: image layers imported into sheaf
    /// repositories start lazily, without being downloaded.
    Snapshotter(snapshotter::SnapshotterArgs),
    /// Software pools: build them, load them on nodes and into Lmod.
    #[command(subcommand)]
    Pool(pool::PoolCmd),
    /// Print the shell function that makes `sheaf pool load` change the
    /// calling shell: eval "$(sheaf shell-init bash)" (or zsh).
    ShellInit {
        /// bash or zsh.
        shell: String,
    },
    /// Pack the upper directory of a writable mount into a layer image
    /// (whiteouts kept) that stacks on the same images.
    Commit(layers::CommitArgs),
    /// Flatten a stack of layers (bottom first, later layers win) into one
    /// image, whiteouts applied.
    Merge(layers::MergeArgs),
    /// Summarise an image: entries, sizes, compression, dedup, root digest.
    ///
    /// A stack BASE,LAYER,... gets the merged tree's figures (inodes shown,
    /// by type, file data, the layers' inodes that do not show) and then
    /// each layer's, bottom first.
    Info {
        /// The image, or a stack of layers BASE,LAYER,... (later layers win).
        image: PathBuf,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
        /// Also list the layer's whiteouts (`.wh.NAME`: hides NAME in the
        /// layers below) and opaque directories (`.wh..wh..opq`); walks the
        /// whole tree.
        #[arg(long)]
        whiteouts: bool,
    },
    /// List a directory of an image (like ls).
    Ls(inspect::LsArgs),
    /// Search an image's tree without mounting it (a find(1) subset).
    Find(find::FindArgs),
    /// Sizes of an image's directories without mounting it (like du).
    Du(du::DuArgs),
    /// Write files of an image to standard output (like cat: symlinks in
    /// the image are followed; a missing file is named and the rest still
    /// written, exit 1).
    Cat {
        /// The image.
        image: PathBuf,
        /// Paths of files inside the image (relative to its root).
        #[arg(required = true, num_args = 1..)]
        paths: Vec<std::ffi::OsString>,
    },
    /// Unpack an image (or parts of it) into a directory, with attributes.
    ///
    /// Never writes outside DIR, whatever the image contains, and never
    /// replaces an existing file. Ownership is restored when running as root;
    /// attributes that cannot be restored are counted and reported. Devices
    /// are made, and setuid/setgid bits kept, only with --preserve.
    Extract(extract::ExtractArgs),
    /// Sign an image's root digest with an OpenSSH key (appended, or --detached).
    Sign(trust::SignArgs),
    /// Check an image's signatures against an allowed_signers file.
    Verify(trust::VerifyArgs),
    /// Print the exact message signatures sign (for ssh-keygen -Y sign/verify).
    Root {
        /// The image.
        image: PathBuf,
    },
    /// Write a new ed25519 key pair and print its allowed_signers line.
    Keygen {
        /// Private key file to create (the public key goes to FILE.pub).
        file: PathBuf,
        /// The principal for the allowed_signers line.
        #[arg(long, default_value = "sheaf-signer")]
        identity: String,
    },
    /// Mount an image, or a stack of them, on a directory (no root needed),
    /// read-only or writable through --upper DIR; returns once it is ready
    /// and serves it from a background process.
    Mount(mount::MountArgs),
    /// Run a command with images mounted at fixed paths (e.g. /data) that
    /// only it sees, without root; the mounts vanish when it exits.
    Run(run::RunArgs),
    /// Unmount a sheaf mount and wait for its process to exit.
    Umount(mount::UmountArgs),
    /// Show live statistics of a mount: cache, bytes read, per-op latency.
    Stats {
        /// Where the image is mounted.
        #[arg(value_hint = clap::ValueHint::DirPath)]
        mountpoint: PathBuf,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Write an image as a static, content-addressed repository for web
    /// servers, caching proxies and CDNs (mount https://HOST/DIR/NAME).
    Publish(remote::PublishArgs),
    /// Rewrite an image so the files a workload reads come first and are
    /// fetched ahead at mount (data copied as stored, not recompressed).
    Optimize(remote::OptimizeArgs),
    /// Inspect or trim the node cache of remote images.
    Cache(remote::CacheArgs),
    /// Verify every metadata page and data block against its hash.
    ///
    /// Exits 0 if the image is intact, 1 with a list of problems otherwise.
    Check {
        /// The image.
        image: PathBuf,
        /// Threads to use (default: all cores).
        #[arg(short = 'j', long)]
        threads: Option<usize>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Print the shell completion script for bash, zsh or fish.
    ///
    /// `make install` installs all three; by hand, e.g. `sheaf completions
    /// bash > ~/.local/share/bash-completion/completions/sheaf`.
    Completions {
        /// The shell.
        #[arg(value_parser = docs::SHELLS)]
        shell: String,
    },
    /// List the entries of an image whose paths start with PREFIX, for the
    /// bash completion script.
    #[command(hide = true)]
    CompleteImagePath {
        /// The image (a local file, or a stack of them).
        image: PathBuf,
        /// A path inside the image, as typed so far.
        #[arg(default_value = "")]
        prefix: std::ffi::OsString,
    },
    /// Write a man page for every command into DIR (`make install` runs it).
    #[command(hide = true)]
    Man {
        /// Where to write sheaf.1, sheaf-mount.1, sheaf-pool-load.1, ...
        #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
}

/// The ids of the remote-image flags ([`util::RemoteArgs`]).
const REMOTE_FLAGS: [&str; 7] = [
    "cache_dir",
    "cache_size",
    "no_cache",
    "mirrors",
    "proxy",
    "timeout",
    "failback",
];

/// Commands that never read an image by URL: the remote flags are left out
/// of their help (and man pages), though accepted. `pool X` is "pool X".
const LOCAL_ONLY: [&str; 14] = [
    "build",
    "import",
    "shell-init",
    "commit",
    "sign",
    "keygen",
    "umount",
    "stats",
    "completions",
    "man",
    "pool init",
    "pool build",
    "pool unload",
    "pool list",
];

/// The command line as users see it: [`Cli`], with the remote flags shown
/// only where they apply (`sheaf --help` shows them once, under their own
/// heading). Parsing, help, man pages and completions all use this.
pub(crate) fn command() -> clap::Command {
    use clap::CommandFactory;
    let mut c = Cli::command();
    // A command that has an argument of a global's id does not get the
    // global (clap's propagation skips it): these get hidden copies, so
    // the flags are still accepted there but not shown.
    let remote: Vec<clap::Arg> = c
        .get_arguments()
        .filter(|a| REMOTE_FLAGS.contains(&a.get_id().as_str()))
        .cloned()
        .collect();
    let hide = |mut sc: clap::Command| {
        for a in &remote {
            sc = sc.arg(a.clone().hide(true));
        }
        sc
    };
    for name in LOCAL_ONLY {
        c = match name.split_once(' ') {
            Some((top, sub)) => c.mut_subcommand(top, |p| p.mut_subcommand(sub, hide)),
            None => c.mut_subcommand(name, hide),
        };
    }
    c
}

/// Where a command run by [`run`] writes: the process's standard output
/// and error ([`Io::process`], what `sheaf-full` uses), or any writers (a
/// test's buffers, [`Io::new`]). Commands that read standard input (`build
/// -`, `mount --request -`) read the process's.
///
/// Written through it: the usage and error lines of every command, and all
/// the output of [`IO_COMMANDS`] (and of pool build, the build summary);
/// the other commands (mount, run, pool, import, bcast, snapshotter: they
/// serve, fork or report as they go) still print to the process's streams.
/// A warning that a URL's cached index stands in for its unreachable
/// server goes to the process's standard error whatever the command.
pub struct Io<'a> {
    /// Standard output.
    pub stdout: Box<dyn Write + 'a>,
    /// Standard error.
    pub stderr: Box<dyn Write + 'a>,
    /// Whether these are the process's own streams (then a closed stdout
    /// ends the process as SIGPIPE does, help is coloured as clap decides,
    /// and terminals get terminal output).
    process: bool,
}

impl Io<'static> {
    /// The process's standard output and error.
    pub fn process() -> Io<'static> {
        Io {
            stdout: Box::new(std::io::stdout()),
            stderr: Box::new(std::io::stderr()),
            process: true,
        }
    }
}

impl<'a> Io<'a> {
    /// Output to `stdout` and `stderr` (e.g. `&mut Vec<u8>`), never a
    /// terminal.
    pub fn new(stdout: impl Write + 'a, stderr: impl Write + 'a) -> Io<'a> {
        Io {
            stdout: Box::new(stdout),
            stderr: Box::new(stderr),
            process: false,
        }
    }

    /// Whether standard output is a terminal (names quoted, columns).
    pub fn stdout_is_tty(&self) -> bool {
        self.process && util::stdout_is_tty()
    }

    /// Whether standard error is a terminal (progress bars).
    pub fn stderr_is_tty(&self) -> bool {
        self.process && util::stderr_is_tty()
    }

    /// The flag long operations poll to stop cleanly: set by SIGINT and
    /// SIGTERM, whose handlers this installs, for the process's own
    /// streams; never set in-process (the handlers are the process's).
    pub(crate) fn cancel_flag(&self) -> &'static std::sync::atomic::AtomicBool {
        static NEVER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
        if self.process {
            util::cancel_flag()
        } else {
            &NEVER
        }
    }
}

/// The commands that write only through [`Io`] (all their output, errors
/// included), which tests may run in-process with [`run`].
pub const IO_COMMANDS: [&str; 24] = [
    "build",
    "commit",
    "merge",
    "ls",
    "cat",
    "info",
    "check",
    "find",
    "du",
    "extract",
    "verify",
    "help",
    "sign",
    "root",
    "keygen",
    "publish",
    "cache",
    "optimize",
    "stats",
    "umount",
    "completions",
    "man",
    "shell-init",
    "complete-image-path",
];

/// Run the `sheaf` command line `args` (the program name first, as
/// `std::env::args_os` gives it) and return its exit code: 0, the
/// command's own code, 2 for a usage error, 1 with one line on stderr for
/// a failure, 128 + N for a command signal N cancelled. `sheaf-full` is
/// `exit(run(args_os(), Io::process()))`.
pub fn run<I, T>(args: I, io: &mut Io<'_>) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    let code = dispatch(args, io);
    let _ = io.stdout.flush();
    let _ = io.stderr.flush();
    code
}

fn dispatch(args: Vec<std::ffi::OsString>, io: &mut Io<'_>) -> i32 {
    // mount(8) runs us as /sbin/mount.fuse.sheaf for `-t fuse.sheaf` and fstab.
    if crate::options::is_helper(args.first().map(|a| a.as_os_str())) {
        return finish(mount::mount_helper(args), io);
    }
    // `sheaf help TOPIC...`: a manual page, or the remote flags
    // (`sheaf help` alone is clap's overview, and a flag after it clap's).
    let flag = |a: &std::ffi::OsString| a.as_encoded_bytes().starts_with(b"-");
    if args.len() >= 3 && args[1] == "help" && !args[2..].iter().any(flag) {
        if args.len() == 3 && args[2] == "remote" {
            let _ = write!(io.stdout, "{}", remote_help().render_help());
            return 0;
        }
        return finish(docs::help(command(), &args[2..], io), io);
    }
    let parsed = command()
        .try_get_matches_from(&args)
        .and_then(|m| <Cli as clap::FromArgMatches>::from_arg_matches(&m));
    let cli = match parsed {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind::*;
            if matches!(
                e.kind(),
                DisplayHelp | DisplayVersion | DisplayHelpOnMissingArgumentOrSubcommand
            ) {
                if io.process {
                    // clap's own printing: coloured on a terminal.
                    let _ = e.print();
                } else if e.use_stderr() {
                    let _ = write!(io.stderr, "{}", e.render());
                } else {
                    let _ = write!(io.stdout, "{}", e.render());
                }
                return e.exit_code();
            }
            if e.kind() == MissingSubcommand {
                // No command (environment-set flags aside): the usage, on stderr.
                let _ = writeln!(io.stderr, "{}", command().render_help());
                return 2;
            }
            let _ = writeln!(
                io.stderr,
                "sheaf: {}",
                one_line_usage_error(&e.render().to_string())
            );
            return 2;
        }
    };
    if io.process {
        // A closed stdout (e.g. `sheaf cat ... | head`) is not an error.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let r = &cli.remote;
    let r = match cli.cmd {
        Cmd::Publish(a) => remote::publish(a, r, io),
        Cmd::Cache(a) => remote::cache(a, r, io),
        Cmd::Optimize(a) => remote::optimize(a, r, io),
        Cmd::Build(a) => build::run(a, io),
        Cmd::Bcast(a) => bcast::run(a, r),
        Cmd::Import(a) => import::run(a),
        Cmd::Snapshotter(a) => snapshotter::run(a, r),
        Cmd::Pool(c) => pool::run(c, r, io),
        Cmd::ShellInit { shell } => pool::shell_init(&shell, io),
        Cmd::Commit(a) => layers::commit(a, io),
        Cmd::Merge(a) => layers::merge(a, r, io),
        Cmd::Info {
            image,
            json,
            whiteouts,
        } => inspect::info(&image, json, whiteouts, r, io),
        Cmd::Ls(a) => inspect::ls(a, r, io),
        Cmd::Find(a) => find::find(a, r, io),
        Cmd::Du(a) => du::du(a, r, io),
        Cmd::Cat { image, paths } => inspect::cat(&image, &paths, r, io),
        Cmd::Extract(a) => extract::run(a, r, io),
        Cmd::Check {
            image,
            threads,
            json,
        } => inspect::check(&image, threads, json, r, io),
        Cmd::Mount(a) => mount::run(a, r),
        Cmd::Run(a) => run::run(a, r),
        Cmd::Sign(a) => trust::sign(a, r, io),
        Cmd::Verify(a) => trust::verify(a, r, io),
        Cmd::Root { image } => trust::root(&image, r, io),
        Cmd::Keygen { file, identity } => trust::keygen(&file, &identity, io),
        Cmd::Umount(a) => mount::umount(a),
        Cmd::Stats { mountpoint, json } => mount::stats(&mountpoint, json, io),
        Cmd::Completions { shell } => docs::completions(command(), &shell, io),
        Cmd::Man { dir } => docs::man(command(), &dir),
        Cmd::CompleteImagePath { image, prefix } => {
            docs::complete_image_path(&image, &prefix, r, io)
        }
    };
    finish(r, io)
}

/// The command's exit code, or its error as one line on stderr and 1.
/// A command a signal cancelled (Ctrl-C, SIGTERM) exits 128 + its number.
fn finish(r: anyhow::Result<i32>, io: &mut Io<'_>) -> i32 {
    // In-process, the signal handlers are not ours ([`Io::cancel_flag`]).
    let signalled = util::cancelled_by().filter(|_| io.process).map(|s| 128 + s);
    match r {
        Ok(0) => 0,
        Ok(code) => signalled.unwrap_or(code),
        Err(e) => {
            let _ = writeln!(io.stderr, "sheaf: error: {}", util::one_line(&e));
            signalled.unwrap_or(1)
        }
    }
}

/// clap's error text as one line: its first line, with the items clap
/// lists under it (the missing arguments) appended, and the help of the
/// command it came from (from its usage line) named.
fn one_line_usage_error(text: &str) -> String {
    let mut lines = text.lines();
    let mut msg = lines
        .next()
        .unwrap_or("bad arguments")
        .trim_start_matches("error: ")
        .trim()
        .to_string();
    let items: Vec<&str> = lines
        .take_while(|l| l.starts_with("  "))
        .map(str::trim)
        .collect();
    if msg.ends_with(':') && !items.is_empty() {
        msg = format!("{msg} {}", items.join(", "));
    } else if let Some(v) = items.iter().find(|i| i.starts_with("[possible values:")) {
        msg = format!("{msg} {v}");
    }
    let command = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Usage: "))
        .map(|u| {
            u.split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| "sheaf".into());
    format!("{msg} (see '{command} --help')")
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    /// No command has two options with one name (clap checks that only in
    /// debug builds, and the tests run the release build): `sheaf du -h`
    /// once listed `-h` for both help and human-readable sizes.
    #[test]
    fn option_names_are_unique_in_every_command() {
        fn walk(c: &mut clap::Command, path: &str, bad: &mut Vec<String>) {
            c.build();
            let mut seen = std::collections::HashMap::new();
            for a in c.get_arguments() {
                let names = a
                    .get_short()
                    .map(|s| format!("-{s}"))
                    .into_iter()
                    .chain(a.get_long().map(|l| format!("--{l}")));
                for n in names {
                    if let Some(prev) = seen.insert(n.clone(), a.get_id().to_string()) {
                        bad.push(format!("{path}: {n} is both {prev} and {}", a.get_id()));
                    }
                }
            }
            for s in c.get_subcommands_mut() {
                let p = format!("{path} {}", s.get_name());
                walk(s, &p, bad);
            }
        }
        let mut bad = Vec::new();
        walk(&mut Cli::command(), "sheaf", &mut bad);
        assert!(bad.is_empty(), "{bad:#?}");
    }

    /// A usage error is one line that says what is wrong and whose help to read.
    #[test]
    fn usage_errors_name_what_is_missing_and_where_to_look() {
        use clap::Parser;
        let line = |args: &[&str]| {
            let e = Cli::try_parse_from(args).expect_err("bad arguments");
            super::one_line_usage_error(&e.render().to_string())
        };
        assert_eq!(
            line(&["sheaf", "du"]),
            "the following required arguments were not provided: <IMAGE> (see 'sheaf du --help')"
        );
        let l = line(&["sheaf", "du", "-x", "img"]);
        assert!(l.starts_with("unexpected argument '-x' found"), "{l}");
        assert!(l.ends_with("(see 'sheaf du --help')"), "{l}");
        let l = line(&["sheaf", "pool", "nosuch"]);
        assert!(l.ends_with("--help')") && !l.contains('\n'), "{l}");
        let l = line(&["sheaf", "completions", "tcsh"]);
        assert!(
            l.starts_with("invalid value 'tcsh' for '<SHELL>' [possible values: bash, zsh, fish]"),
            "{l}"
        );
    }
}
