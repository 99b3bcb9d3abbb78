//! Small helpers shared by commands.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

pub use crate::options::{parse_size, parse_size64};
pub use crate::paths::{prefetch_blocks, read_path_list};

/// An error and its causes (`source()` chain) on one line, each cause once:
/// a message that already spells out its cause does not repeat it.
/// URLs in it lose their credentials and signed parameters
/// ([`sheaf_net::redact_text`]), whatever part of the chain quoted them.
pub fn one_line(e: &anyhow::Error) -> String {
    sheaf_net::redact_text(&sheaf_format::one_line(e.as_ref()))
}

/// Whether standard output is a terminal (names from images are then
/// quoted: [`terminal_name`]).
pub fn stdout_is_tty() -> bool {
    // SAFETY: isatty on a constant descriptor.
    unsafe { libc::isatty(1) == 1 }
}

/// Names from images as a terminal sees them: the one quoting, in
/// [`sheaf_read::tree::terminal_name`].
pub use sheaf_read::tree::terminal_name;

/// Run `cmd` with `input` on its standard input (a typed request, e.g.
/// [`sheaf_mount::MountRequest`]), collecting its output.
pub fn output_with_input(
    cmd: &mut std::process::Command,
    input: &[u8],
) -> std::io::Result<std::process::Output> {
    use std::io::Write;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("piped");
    // A child that fails before reading closes the pipe: its own error is
    // the one to report.
    let _ = stdin.write_all(input);
    drop(stdin);
    child.wait_with_output()
}

/// The compression ratio as every command shows it: file data over image
/// size, "8.65x" (below 1 when the image is larger, e.g. a tiny layer).
pub fn ratio(logical: u64, image: u64) -> String {
    format!("{:.2}x", logical as f64 / image.max(1) as f64)
}

/// Human-readable bytes.
pub fn human(n: u64) -> String {
    match scaled(n, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB"]) {
        (_, "B") => format!("{n} B"),
        (v, unit) => format!("{v:.1} {unit}"),
    }
}

/// A size (or count) as GNU `ls -h` and `du -h` print it, so that
/// `sort -h` orders it: below 1024 the number itself, else powers of 1024
/// with K, M, G, T, P, E, one decimal below 10 and none above, rounded
/// up (1025 is "1.1K", 10239 "10K", 1048575 "1.0M"), as coreutils'
/// human.c does with exact integer arithmetic.
pub fn human_size(n: u64) -> String {
    const UNITS: [char; 6] = ['K', 'M', 'G', 'T', 'P', 'E'];
    if n < 1024 {
        return n.to_string();
    }
    let (mut amt, mut tenths, mut inexact, mut power) = (n, 0u64, false, 0usize);
    // Divide while the quotient is 1024 or more, keeping the first
    // decimal digit and whether anything below it was dropped.
    loop {
        let r10 = (amt % 1024) * 10 + tenths;
        inexact |= r10 % 1024 != 0;
        amt /= 1024;
        tenths = r10 / 1024;
        power += 1;
        if amt < 1024 || power == UNITS.len() {
            break;
        }
    }
    if amt < 10 {
        if inexact {
            tenths += 1;
            inexact = false;
            if tenths == 10 {
                amt += 1;
                tenths = 0;
            }
        }
        if amt < 10 {
            return format!("{amt}.{tenths}{}", UNITS[power - 1]);
        }
    }
    if tenths > 0 || inexact {
        amt += 1;
        if amt == 1024 && power < UNITS.len() {
            return format!("1.0{}", UNITS[power]);
        }
    }
    format!("{amt}{}", UNITS[power - 1])
}

/// `n` divided by `base` until below it (or out of units), with its unit.
fn scaled(n: u64, base: f64, units: &[&'static str]) -> (f64, &'static str) {
    let mut v = n as f64;
    let mut u = 0;
    while v >= base && u < units.len() - 1 {
        v /= base;
        u += 1;
    }
    (v, units[u])
}

static CANCEL: AtomicBool = AtomicBool::new(false);
static SIGNAL: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

extern "C" fn on_signal(sig: libc::c_int) {
    SIGNAL.store(sig, Ordering::SeqCst);
    CANCEL.store(true, Ordering::SeqCst);
}

/// The signal that cancelled the command, if one did: it then exits
/// 128 + the signal's number, as a shell reports a process the signal
/// killed (130 for Ctrl-C).
pub fn cancelled_by() -> Option<i32> {
    match SIGNAL.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Make SIGINT/SIGTERM set a flag that long operations poll, so they can
/// clean up (remove temporary files) instead of dying mid-write.
pub fn cancel_flag() -> &'static AtomicBool {
    // SAFETY: the handler only stores to an atomic, which is signal-safe.
    unsafe {
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
    }
    &CANCEL
}

/// Whether stderr is a terminal (progress bars only then).
pub fn stderr_is_tty() -> bool {
    // SAFETY: isatty on a constant fd.
    unsafe { libc::isatty(2) == 1 }
}

/// How remote images are reached and cached: the flags of every command
/// that reads an image (shown only there: `command` in main.rs).
#[derive(clap::Args, Debug, Clone, Default)]
#[command(next_help_heading = "Remote images (URLs)")]
pub struct RemoteArgs {
    /// Node cache for remote images: pages and blocks by digest, shared by
    /// all images, versions and processes [default: /var/cache/sheaf for
    /// root, else $XDG_CACHE_HOME/sheaf or ~/.cache/sheaf]
    #[arg(long, global = true, value_name = "DIR", env = "SHEAF_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Size quota of the node cache; least recently used objects go first.
    #[arg(long, global = true, value_name = "SIZE", env = "SHEAF_CACHE_SIZE", default_value = "10G", value_parser = parse_size64)]
    pub cache_size: u64,
    /// Do not use the node cache (remote images only; each read is fetched).
    #[arg(long, global = true)]
    pub no_cache: bool,
    /// Another URL of the same image or repository, tried when the first
    /// fails (repeatable; back to the first after --failback seconds).
    #[arg(long = "mirror", global = true, value_name = "URL")]
    pub mirrors: Vec<String>,
    /// Proxies to try in order, separated by ';' or ','; DIRECT means none
    /// [default: http_proxy / https_proxy / no_proxy from the environment]
    #[arg(long, global = true, value_name = "LIST", env = "SHEAF_PROXY")]
    pub proxy: Option<String>,
    /// Longest a remote read may take over all retries and failovers; past
    /// it the read fails (EIO in a mount) and the reason is logged.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
    /// After failing over to a mirror or proxy, return to the first after
    /// this many seconds.
    #[arg(long, global = true, value_name = "SECS", default_value_t = 300.0)]
    pub failback: f64,
    /// Wait, with the usual backoff, up to --timeout for a server never
    /// reached yet (`sheaf mount --wait-for-server`, a request's
    /// `wait_for_server`); not a flag of every command.
    #[arg(skip)]
    pub wait_for_server: bool,
}

impl RemoteArgs {
    /// The flags' defaults and environment variables, as when no flag is
    /// given (for mount(8), which passes none).
    pub fn from_env() -> anyhow::Result<RemoteArgs> {
        use clap::Parser;
        #[derive(Parser)]
        struct Only {
            #[command(flatten)]
            remote: RemoteArgs,
        }
        Ok(Only::try_parse_from(["sheaf"])
            .map_err(|e| anyhow::anyhow!("{}", e.render().to_string().trim()))?
            .remote)
    }

    /// These settings with those given as mount options (fstab has no flags).
    pub fn with_options(&self, o: &crate::options::RemoteOptions) -> RemoteArgs {
        let mut r = self.clone();
        if o.cache_dir.is_some() {
            r.cache_dir.clone_from(&o.cache_dir);
        }
        if let Some(q) = o.cache_quota {
            r.cache_size = q;
        }
        r.no_cache |= o.no_cache;
        r.mirrors.extend(o.mirrors.iter().cloned());
        if o.proxy.is_some() {
            r.proxy.clone_from(&o.proxy);
        }
        if let Some(t) = o.timeout {
            r.timeout = t;
        }
        if let Some(t) = o.failback {
            r.failback = t;
        }
        r
    }

    /// These settings as flags for a sheaf child process that serves a
    /// mount and lives on, where every user's `ps` sees its command line:
    /// all but the mirrors and the proxy, which may hold credentials and
    /// go in the child's typed request ([`RemoteArgs::put_routes`]).
    pub fn to_args_without_routes(&self) -> Vec<String> {
        RemoteArgs {
            mirrors: Vec::new(),
            proxy: None,
            ..self.clone()
        }
        .to_args()
    }

    /// Hand the mirrors and the proxy to a mount child in its request.
    pub fn put_routes(&self, req: &mut sheaf_mount::MountRequest) {
        req.mirrors = self.mirrors.clone();
        req.proxy = self.proxy.clone();
        req.wait_for_server = self.wait_for_server;
    }

    /// These settings with the routes a request carries (which stand for
    /// the flags' when given).
    pub fn with_routes(&self, req: &sheaf_mount::MountRequest) -> RemoteArgs {
        let mut r = self.clone();
        if !req.mirrors.is_empty() {
            r.mirrors = req.mirrors.clone();
        }
        if req.proxy.is_some() {
            r.proxy = req.proxy.clone();
        }
        r.wait_for_server |= req.wait_for_server;
        r
    }

    /// These settings as flags, for a short-lived sheaf child process
    /// (mount children take [`RemoteArgs::to_args_without_routes`]).
    pub fn to_args(&self) -> Vec<String> {
        let mut v = vec![
            format!("--cache-size={}", self.cache_size),
            format!("--timeout={}", self.timeout),
            format!("--failback={}", self.failback),
        ];
        if let Some(d) = &self.cache_dir {
            v.push(format!("--cache-dir={}", d.display()));
        }
        if self.no_cache {
            v.push("--no-cache".into());
        }
        for m in &self.mirrors {
            v.push(format!("--mirror={m}"));
        }
        if let Some(p) = &self.proxy {
            v.push(format!("--proxy={p}"));
        }
        v
    }

    /// The library's settings from these flags.
    pub fn config(&self) -> anyhow::Result<sheaf_net::RemoteConfig> {
        Ok(sheaf_net::RemoteConfig {
            cache_dir: self.cache_dir.clone(),
            cache_quota: self.cache_size,
            no_cache: self.no_cache,
            http: http_options(self)?,
        })
    }
}

/// Network settings from the flags.
pub fn http_options(a: &RemoteArgs) -> anyhow::Result<sheaf_net::HttpOptions> {
    let secs = |v: f64, what: &str| {
        std::time::Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| anyhow::anyhow!("--{what} {v}: not a positive number of seconds"))
    };
    let deadline = secs(a.timeout, "timeout")?;
    Ok(sheaf_net::HttpOptions {
        deadline,
        request_timeout: deadline.min(std::time::Duration::from_secs(30)),
        connect_timeout: deadline.min(std::time::Duration::from_secs(10)),
        failback: secs(a.failback, "failback")?,
        mirrors: a.mirrors.clone(),
        proxies: a
            .proxy
            .iter()
            .flat_map(|l| l.split([';', ',']))
            .map(|p| p.trim().to_string())
            .filter(|p| !p.is_empty())
            .collect(),
        on_wait: stderr_is_tty().then_some(waiting_line as fn(&str, _, _)),
        wait_for_server: a.wait_for_server,
        on_server_wait: Some(waiting_for_server),
        ..Default::default()
    })
}

/// The line said once when the first open of a URL image starts waiting
/// for a server never reached (`--wait-for-server`); `server` is redacted.
fn waiting_for_server(server: &str, why: &str, limit: std::time::Duration) {
    eprintln!(
        "sheaf: waiting for {server} ({why}), up to {} s",
        limit.as_secs_f64().round()
    );
}

/// The live line shown on a terminal while a server that failed is waited
/// for ("waiting for HOST: 12 s of 60"), rewritten in place.
fn waiting_line(host: &str, waited: std::time::Duration, limit: std::time::Duration) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = write!(
        e,
        "\r\x1b[2Ksheaf: waiting for {host}: {} s of {} (--timeout)\r",
        waited.as_secs(),
        limit.as_secs()
    );
    let _ = e.flush();
}

/// The node cache named by the flags (None with --no-cache).
pub fn disk_cache(a: &RemoteArgs) -> anyhow::Result<Option<Arc<sheaf_net::DiskCache>>> {
    Ok(a.config()?.disk_cache()?)
}

/// An image named on the command line, opened (a local file or a URL, see
/// [`sheaf_net::open_image`]); warns when a cached index stands in for an
/// unreachable server. `wrap` may interpose on the source.
pub fn open_image_with(
    arg: &Path,
    remote: &RemoteArgs,
    opts: sheaf_read::ImageOptions,
    wrap: impl FnOnce(Arc<dyn sheaf_read::Source>) -> Arc<dyn sheaf_read::Source>,
) -> anyhow::Result<sheaf_read::Image> {
    let s = arg.to_string_lossy();
    if stack_layers(arg).is_some() {
        // One image is opened here; stacks are opened by open_stack.
        anyhow::bail!(
            "{s}: a stack of layers (BASE,LAYER) is read by ls, cat, find, du, info, mount, run and merge; for this command merge it first (sheaf merge {s} -o MERGED.sheaf)"
        );
    }
    let o = sheaf_net::open_image(arg, &remote.config()?, opts, wrap)?;
    if let Some(t) = o.offline_since {
        let age = t.elapsed().unwrap_or_default().as_secs();
        eprintln!(
            "sheaf: warning: {} is unreachable; using the index cached {} ago",
            sheaf_net::redact(&s),
            human_duration(age)
        );
    }
    Ok(o.image)
}

/// The layers of a stack named on the command line, `BASE,LAYER,...`
/// (bottom first), or None when `arg` names one image: an existing file or
/// a URL is one image even if its name holds a comma.
pub fn stack_layers(arg: &Path) -> Option<Vec<PathBuf>> {
    let s = arg.to_string_lossy();
    (s.contains(',') && !sheaf_net::is_url(&s) && !arg.exists()).then(|| {
        s.split(',')
            .filter(|p| !p.is_empty())
            .map(PathBuf::from)
            .collect()
    })
}

/// Image arguments with every stack among them split into its layers
/// (`sheaf mount A,B C MP`, `sheaf merge A,B`), bottom first.
pub fn split_layers(args: &[PathBuf]) -> Vec<PathBuf> {
    args.iter()
        .flat_map(|a| stack_layers(a).unwrap_or_else(|| vec![a.clone()]))
        .collect()
}

/// Open the layers of a stack argument ([`stack_layers`]) as one tree.
pub fn open_stack(layers: &[PathBuf], remote: &RemoteArgs) -> anyhow::Result<sheaf_read::Stack> {
    let images = layers
        .iter()
        .map(|p| open_image(p, remote).map(Arc::new))
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(sheaf_read::Stack::new(images))
}

/// An image argument as it may be shown (printed, put in JSON): a URL
/// through [`sheaf_net::SecretUrl`], its credentials redacted.
pub fn shown(arg: &Path) -> String {
    sheaf_net::SecretUrl::new(arg.to_string_lossy()).to_string()
}

/// Open an image named on the command line (file or URL).
pub fn open_image(arg: &Path, remote: &RemoteArgs) -> anyhow::Result<sheaf_read::Image> {
    open_image_with(arg, remote, Default::default(), |s| s)
}

/// "3 h", "2 d": an age for messages.
pub fn human_duration(secs: u64) -> String {
    match secs {
        s if s < 120 => format!("{s} s"),
        s if s < 7200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3600),
        s => format!("{} d", s / 86400),
    }
}

/// The signature policy flags shared by every command that brings an image
/// into use (mount, run, bcast, pool load).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct PolicyArgs {
    /// Refuse the image unless a signature is trusted by --signers (also set
    /// site-wide by `[signatures] require = true` in /etc/sheaf/config.toml
    /// or $SHEAF_CONFIG).
    #[arg(long)]
    pub require_signature: bool,
    /// OpenSSH allowed_signers file of trusted keys.
    #[arg(long, value_name = "FILE")]
    pub signers: Option<PathBuf>,
    /// Require the signing key to be trusted for this principal.
    #[arg(long, value_name = "NAME")]
    pub identity: Option<String>,
}

impl PolicyArgs {
    /// The flags combined with the site configuration.
    pub fn load(&self) -> anyhow::Result<sheaf_trust::Policy> {
        Ok(sheaf_trust::Policy::load(
            self.require_signature,
            self.signers.clone(),
            self.identity.clone(),
        )?)
    }
}

/// The path of the `sheaf` program (the small front that ran this one, when
/// it did), for paths printed into shell functions, modulefiles and units.
pub fn sheaf_exe() -> std::io::Result<PathBuf> {
    match std::env::var_os(crate::front::EXE_ENV) {
        Some(p) if !p.is_empty() => Ok(PathBuf::from(p)),
        _ => std::env::current_exe(),
    }
}

/// What `--json` prints for a report: its fields, `seconds`, and the
/// fields a command adds (`extra`, an object), as one object with sorted
/// keys (serde_json's own order).
pub fn timed_json(
    report: &impl serde::Serialize,
    seconds: f64,
    extra: serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    #[derive(serde::Serialize)]
    struct Timed<'a, R> {
        #[serde(flatten)]
        report: &'a R,
        seconds: f64,
        #[serde(flatten)]
        extra: serde_json::Value,
    }
    Ok(serde_json::to_value(Timed {
        report,
        seconds,
        extra,
    })?)
}

#[cfg(test)]
mod tests {
    #[test]
    fn names_are_quoted_as_gnu_ls_quotes_them_on_a_terminal() {
        use super::terminal_name;
        // Expected values: GNU ls 9.1, `ls --quoting-style=shell-escape` in
        // a UTF-8 locale, on the same names.
        assert_eq!(terminal_name(b"plain.txt"), "plain.txt");
        assert_eq!(terminal_name(b"two words"), "'two words'");
        assert_eq!(terminal_name(b"it's"), "\"it's\"");
        assert_eq!(terminal_name(b"a\x1b[31mred"), r"'a'$'\033''[31mred'");
        assert_eq!(terminal_name(b"new\nline"), r"'new'$'\n''line'");
        assert_eq!(terminal_name(b"\xff"), r"''$'\377'");
        assert_eq!(terminal_name(b"a\x07\x1bz"), r"'a'$'\a\033''z'");
        assert_eq!(terminal_name("é".as_bytes()), "é");
    }

    #[test]
    fn sizes_read_as_gnu_ls_and_du_print_them() {
        // Expected values: GNU coreutils 9.1, `truncate -s N f; du -h
        // --apparent-size f` (ls -lh prints the same).
        let h = super::human_size;
        for (n, want) in [
            (0, "0"),
            (1, "1"),
            (1023, "1023"),
            (1024, "1.0K"),
            (1025, "1.1K"),
            (10239, "10K"),
            (10240, "10K"),
            (10241, "11K"),
            (104_857, "103K"),
            (1_048_575, "1.0M"),
            (1_048_576, "1.0M"),
            (1_300_000_000, "1.3G"),
            // No file is this large: `numfmt --to=iec --round=up`.
            (u64::MAX, "16E"),
        ] {
            assert_eq!(h(n), want, "{n}");
        }
    }
}
