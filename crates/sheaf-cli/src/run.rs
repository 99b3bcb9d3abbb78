//! `sheaf run`: run a command with images mounted at fixed paths, visible
//! to it alone, without root.
//!
//! Order matters: the namespace is entered while the process is still
//! single-threaded (the kernel refuses a user namespace otherwise), then the
//! mount points are made (see [`sheaf_mount::namespace`]), then the images
//! are opened and served by threads of this process, and only then is the
//! command started. When the command ends the mounts are detached and this
//! process exits with the command's status, or dies of the same signal.
//!
//! Where namespaces are not available (or `--no-namespace`), the images
//! are mounted on private temporary directories through `fusermount3`
//! instead, and their paths are given to the command in environment
//! variables.

use crate::mount::fsname_of;
use crate::util::split_layers;
use anyhow::{anyhow, bail, Context, Result};
use sheaf_mount::namespace::{self, Identity, Scratch};
use sheaf_mount::serve::{Connected, MountConfig};
use sheaf_mount::{kernel, FsConfig, SheafFs};
use std::ffi::OsString;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const RUN_HELP: &str = "\
Mount specs (--mount, repeatable):
  IMAGE[,IMAGE...]:DEST[:OPTION...]
    IMAGE   an image file or http(s):// URL; several are stacked bottom first
    DEST    an absolute path where the command sees them (created privately
            if missing: nothing is created on any real filesystem)
  options:
    upper=DIR      writable overlay; changes go to DIR (see sheaf mount --upper)
    record=FILE    write the files read, in first-read order, at exit (one image)
    prefetch=FILE  fetch the blocks of the files listed in FILE at mount (one image)

The command runs in a private mount namespace (an unprivileged user namespace
when not root): no other process sees the mounts, and they vanish when it
exits or is killed. Its stdin, stdout and stderr are untouched; its exit status
is sheaf's, and if it dies of a signal, sheaf dies of the same signal. Signals
sent to sheaf (kill) are passed on to it.

Without namespaces (refused by the kernel, or --no-namespace) the images are
mounted on private temporary directories instead, given to the command as
SHEAF_MOUNT_<DEST> (e.g. /data -> $SHEAF_MOUNT_DATA) and in SHEAF_MOUNTS
(DEST=PATH;...). A note on stderr says so.

Exit status: the command's; 125 if sheaf itself failed, 126 if the command
could not be run, 127 if it was not found.

Examples:
  sheaf run --mount data.sheaf:/data -- python3 analyse.py /data/run1
  sheaf run --mount site.sheaf,project.sheaf:/opt/sw -- module avail
  sheaf run --root --mount base.sheaf:/work:upper=changes -- pip install numpy
  ssh host sheaf run --mount data.sheaf:/data -- /usr/lib/openssh/sftp-server";

/// Arguments of `sheaf run`.
#[derive(clap::Args, Debug)]
#[command(
    after_long_help = RUN_HELP,
    override_usage = "sheaf run [OPTIONS] [--mount SPEC]... [--] CMD [ARGS]..."
)]
pub struct RunArgs {
    /// IMAGE[,IMAGE...]:DEST[:upper=DIR][:record=FILE][:prefetch=FILE]
    /// (with --image, DEST is inside the container)
    #[arg(short = 'm', long = "mount", value_name = "SPEC")]
    mounts: Vec<String>,
    /// Appear as root (uid and gid 0) inside, mapped to you outside
    /// (fakeroot for package managers in an overlay).
    #[arg(long)]
    root: bool,
    /// Appear as this uid (and gid) inside, mapped to you outside.
    #[arg(long, value_name = "UID[:GID]", conflicts_with = "root")]
    uid_map: Option<String>,
    /// Do not use namespaces: mount on private temporary directories and
    /// pass their paths in SHEAF_MOUNT_* variables.
    #[arg(long)]
    no_namespace: bool,
    /// Run a container image as `/`: a flattened image file or URL
    /// (`sheaf import --flatten`), or docker://…, oci:DIR[:TAG],
    /// docker-archive:FILE (imported into the node cache first).
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
    /// With --image: say what of the container's root could not be made
    /// (e.g. a home directory the image has no place for), on one line.
    #[arg(short = 'v', long, requires = "image")]
    verbose: bool,
    /// With --image: keep the container's changes in DIR (default: a
    /// temporary upper, gone at exit).
    #[arg(long, value_name = "DIR", requires = "image")]
    upper: Option<PathBuf>,
    /// With --image: do not bind $HOME (by default it is bound read-write,
    /// so the image's command can change ~/.bashrc, ~/.ssh, ...): the home
    /// inside is an empty tmpfs, gone at exit. The working directory is
    /// not bound either when it is inside $HOME.
    #[arg(long, requires = "image")]
    no_home: bool,
    /// With --image: bind none of $HOME, /tmp and the working directory
    /// (as Apptainer's --contain): the home and /tmp inside are fresh
    /// empty tmpfs, gone at exit. For an image you do not trust.
    #[arg(long, requires = "image")]
    contain: bool,
    /// With --image: set VAR=VALUE in the container. Repeatable.
    #[arg(
        short = 'e',
        long = "env",
        value_name = "VAR=VALUE",
        requires = "image"
    )]
    env: Vec<String>,
    /// With a docker:// image: reach this registry over plain HTTP.
    #[arg(long = "insecure-registry", value_name = "HOST[:PORT]")]
    insecure: Vec<String>,
    /// The command and its arguments (with --image, default: the image's
    /// Entrypoint and Cmd).
    #[arg(
        required_unless_present = "image",
        trailing_var_arg = true,
        value_name = "CMD"
    )]
    command: Vec<OsString>,
}

/// What `--image` found before the namespace was entered.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct Container {
    /// The flattened image (path or URL).
    image: String,
    /// Its root digest (hex), the only one the mount will accept: the
    /// config below and the policy decision were taken from this open.
    root: String,
    /// What its config asks for.
    process: sheaf_oci::runtime::Process,
    /// The config's User as ids, if set.
    user: Option<(u32, u32)>,
}

/// The host directories `--image` binds at their paths, and where it
/// mounts a fresh empty tmpfs instead (with its mode): by default /tmp,
/// `home` and `cwd` bound read-write; `no_home` leaves out the home (and
/// a `cwd` inside it) for an empty one; `contain` binds nothing and gives
/// an empty /tmp and home.
fn host_dirs(
    home: Option<&Path>,
    cwd: Option<&Path>,
    no_home: bool,
    contain: bool,
) -> (Vec<PathBuf>, Vec<(PathBuf, u32)>) {
    let tmp = PathBuf::from("/tmp");
    let empty_home = home
        .filter(|h| h.is_absolute() && *h != Path::new("/"))
        .map(|h| (h.to_path_buf(), 0o700));
    if contain {
        // A home under /tmp is not made in the new, empty /tmp.
        let mut tmpfs = vec![(tmp.clone(), 0o1777)];
        tmpfs.extend(empty_home.filter(|(h, _)| !h.starts_with(&tmp)));
        return (Vec::new(), tmpfs);
    }
    if no_home {
        let mut binds = vec![tmp];
        let in_home = |c: &Path| home.is_some_and(|h| c.starts_with(h) || h.starts_with(c));
        binds.extend(cwd.filter(|c| !in_home(c)).map(Path::to_path_buf));
        return (binds, empty_home.into_iter().collect());
    }
    let mut binds = vec![tmp];
    binds.extend(home.map(Path::to_path_buf));
    binds.extend(cwd.map(Path::to_path_buf));
    (binds, Vec::new())
}

/// Run `f` in a forked child and return what it returned. Reading an image
/// over the network starts threads, and a process with threads may no
/// longer enter a user namespace: the child does it and is gone.
fn in_child<T: serde::Serialize + serde::de::DeserializeOwned>(
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    use std::io::{Read, Write};
    use std::os::fd::FromRawFd;
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: this process is single-threaded here (the caller's rule).
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        // SAFETY: fds[0] is ours to close; fds[1] becomes the File.
        unsafe { libc::close(fds[0]) };
        let mut w = unsafe { std::fs::File::from_raw_fd(fds[1]) };
        let r: std::result::Result<T, String> = f().map_err(|e| crate::util::one_line(&e));
        let _ = w.write_all(&serde_json::to_vec(&r).unwrap_or_default());
        drop(w);
        // SAFETY: leave without running the parent's destructors twice.
        unsafe { libc::_exit(0) };
    }
    // SAFETY: fds[1] is ours to close; fds[0] becomes the File.
    unsafe { libc::close(fds[1]) };
    let mut r = unsafe { std::fs::File::from_raw_fd(fds[0]) };
    let mut buf = Vec::new();
    let read = r.read_to_end(&mut buf);
    let mut st = 0;
    // SAFETY: our child.
    unsafe { libc::waitpid(pid, &mut st, 0) };
    read?;
    let r: std::result::Result<T, String> = serde_json::from_slice(&buf)
        .map_err(|_| anyhow!("preparing the image failed (its process ended with status {st})"))?;
    r.map_err(anyhow::Error::msg)
}

/// Find the flattened image `arg` names (importing a container reference
/// into the node cache) and read its config. Runs in a child.
fn prepare_container(
    arg: &str,
    insecure: &[String],
    remote: &crate::util::RemoteArgs,
) -> Result<Container> {
    // The policy decides on this open (the mount later accepts only the
    // root read here: check_pin).
    let policy = sheaf_trust::Policy::load(false, None, None)?;
    let image = match sheaf_oci::Reference::parse(arg) {
        // What a registry serves carries no signature of ours: imported
        // here, it could only be refused after the download.
        Ok(_) if policy.require => bail!(
            "{arg}: signatures are required and an image taken from a registry is not signed; \
             import it (sheaf import {arg} --flatten -o IMG), check it, sign it (sheaf sign IMG -k KEY) and run IMG"
        ),
        Ok(r) => {
            let ropts = sheaf_oci::RegistryOptions {
                insecure: insecure.to_vec(),
                auth_file: None,
            };
            let src = sheaf_oci::open_source(&r, &ropts)?;
            let digest = sheaf_oci::manifest_digest(&*src, None)?;
            let dir = remote
                .cache_dir
                .clone()
                .or_else(sheaf_net::default_cache_dir)
                .ok_or_else(|| {
                    anyhow!("no cache directory for imported images (set SHEAF_CACHE_DIR)")
                })?
                .join("images");
            std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
            let file = dir.join(format!("{}.sheaf", digest.file_form()));
            if !file.exists() {
                let opts = sheaf_oci::ImportOptions {
                    flatten: Some(file.clone()),
                    ..Default::default()
                };
                eprintln!("sheaf run: importing {arg} into {}", file.display());
                sheaf_oci::import(&*src, &opts, crate::util::cancel_flag(), &|_, _, _| {})?;
            }
            file.to_string_lossy().into_owned()
        }
        Err(_) => arg.to_string(),
    };
    let img = crate::util::open_image_with(Path::new(&image), remote, Default::default(), |s| s)?;
    crate::trust::enforce(&policy, &img, Path::new(&image))?;
    let read = |p: &str| -> Result<Option<Vec<u8>>> {
        let Ok(ino) = img.resolve(p.as_bytes()) else {
            return Ok(None);
        };
        if ino.file_type() != sheaf_format::FileType::Regular {
            return Ok(None);
        }
        // Small documents only: a hostile image must not make this allocate.
        let mut out = vec![0u8; ino.rec.size.min(16 << 20) as usize];
        let mut off = 0;
        while off < out.len() {
            let n = img.read(&ino, off as u64, &mut out[off..])?;
            if n == 0 {
                break;
            }
            off += n;
        }
        out.truncate(off);
        Ok(Some(out))
    };
    let cfg_path = format!("/{}/config.json", sheaf_oci::record::FLAT_DIR);
    let cfg = read(&cfg_path)?.ok_or_else(|| {
        anyhow!("{image}: not a container image (no {cfg_path}; make one with sheaf import --flatten, or use --mount)")
    })?;
    let process = sheaf_oci::runtime::Process::from_config(&cfg)?;
    let text = |p| -> Result<String> {
        Ok(String::from_utf8_lossy(&read(p)?.unwrap_or_default()).into_owned())
    };
    let user = sheaf_oci::runtime::resolve_user(
        &process.user,
        &text("/etc/passwd")?,
        &text("/etc/group")?,
    )?;
    Ok(Container {
        root: sheaf_format::hex(&img.root_digest()),
        image,
        process,
        user,
    })
}

/// One `--mount`.
#[derive(Debug, Clone, PartialEq)]
struct Spec {
    images: Vec<PathBuf>,
    dest: PathBuf,
    upper: Option<PathBuf>,
    record: Option<PathBuf>,
    prefetch: Option<PathBuf>,
    /// The root digest the (single) image must have.
    pin: Option<sheaf_format::Digest>,
}

/// Parse `IMAGE[,IMAGE]:DEST[:k=v...]` (URLs contain `:`, so options and
/// DEST are taken from the right).
fn parse_spec(s: &str) -> Result<Spec> {
    let mut parts: Vec<&str> = s.split(':').collect();
    let mut spec = Spec {
        images: Vec::new(),
        dest: PathBuf::new(),
        upper: None,
        record: None,
        prefetch: None,
        pin: None,
    };
    while let Some(last) = parts.last() {
        let Some((k, v)) = last.split_once('=') else {
            break;
        };
        if v.is_empty() {
            bail!("--mount {s}: option {k}= needs a value");
        }
        let v = crate::mount::absolute(Path::new(v));
        match k {
            "upper" => spec.upper = Some(v),
            "record" => spec.record = Some(v),
            "prefetch" => spec.prefetch = Some(v),
            _ => bail!("--mount {s}: unknown option '{k}' (use upper=, record= or prefetch=)"),
        }
        parts.pop();
    }
    let missing =
        || anyhow!("--mount {s}: missing :DEST, where the image appears (e.g. --mount {s}:/data)");
    // No ':' at all: no DEST.
    if parts.len() < 2 {
        return Err(missing());
    }
    let dest = parts
        .pop()
        .filter(|d| !d.is_empty())
        .ok_or_else(|| anyhow!("--mount {s}: expected IMAGE:DEST"))?;
    // What follows a URL's own ':' ("http://host:8080/x.sheaf") is not a DEST.
    if dest.starts_with("//") || (!dest.starts_with('/') && s.contains("://")) {
        return Err(missing());
    }
    if !dest.starts_with('/') {
        bail!("--mount {s}: DEST '{dest}' must be an absolute path");
    }
    if dest.trim_end_matches('/').is_empty() {
        bail!("--mount {s}: cannot mount over /");
    }
    let images = parts.join(":");
    if images.is_empty() {
        bail!("--mount {s}: expected IMAGE:DEST");
    }
    spec.images = split_layers(&[PathBuf::from(images)]);
    spec.dest = PathBuf::from(dest);
    let single = spec.images.len() == 1 && spec.upper.is_none();
    if !single && (spec.record.is_some() || spec.prefetch.is_some()) {
        bail!("--mount {s}: record= and prefetch= apply to a single read-only image");
    }
    Ok(spec)
}

/// The environment variable that names DEST's temporary mount point.
fn env_name(dest: &Path) -> String {
    let mut n = String::from("SHEAF_MOUNT");
    let mut last_us = false;
    for c in dest.to_string_lossy().chars() {
        if c.is_ascii_alphanumeric() {
            if last_us || n == "SHEAF_MOUNT" {
                n.push('_');
            }
            n.push(c.to_ascii_uppercase());
            last_us = false;
        } else {
            last_us = true;
        }
    }
    n
}

/// The private directory DEST is mounted on without namespaces (`/opt/x`:
/// `opt_x`).
fn mount_dir_name(dest: &Path) -> String {
    env_name(dest)
        .trim_start_matches("SHEAF_MOUNT_")
        .to_lowercase()
}

/// Signals passed on to the command.
const FORWARD: [libc::c_int; 9] = [
    libc::SIGHUP,
    libc::SIGINT,
    libc::SIGQUIT,
    libc::SIGTERM,
    libc::SIGUSR1,
    libc::SIGUSR2,
    libc::SIGWINCH,
    libc::SIGCONT,
    libc::SIGALRM,
];

fn signal_set() -> libc::sigset_t {
    // SAFETY: plain sigset manipulation on a local.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARD.iter().chain(&[libc::SIGCHLD]) {
            libc::sigaddset(&mut set, *s);
        }
        set
    }
}

/// `sheaf run`.
pub fn run(a: RunArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    match run_inner(a, remote) {
        Ok(code) => Ok(code),
        Err(e) => {
            eprintln!("sheaf run: {}", crate::util::one_line(&e));
            Ok(125)
        }
    }
}

fn run_inner(a: RunArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let specs = a
        .mounts
        .iter()
        .map(|s| parse_spec(s))
        .collect::<Result<Vec<_>>>()?;
    for (i, s) in specs.iter().enumerate() {
        if specs[..i].iter().any(|o| o.dest == s.dest) {
            bail!("--mount: {} is given twice", s.dest.display());
        }
    }
    let container = match &a.image {
        Some(i) => Some(in_child(|| prepare_container(i, &a.insecure, remote))?),
        None => None,
    };
    let id = match (&a.uid_map, a.root) {
        (_, true) => Identity {
            uid: Some(0),
            gid: Some(0),
        },
        (Some(m), _) => {
            let (u, g) = match m.split_once(':') {
                Some((u, g)) => (u, Some(g)),
                None => (m.as_str(), None),
            };
            let num = |v: &str| {
                v.parse::<u32>()
                    .map_err(|_| anyhow!("--uid-map {m}: expected UID[:GID] numbers"))
            };
            Identity {
                uid: Some(num(u)?),
                gid: g.map(num).transpose()?.or(Some(num(u)?)),
            }
        }
        _ => match container.as_ref().and_then(|c| c.user) {
            // The config's User, unless it is root: without --root a
            // container runs as the caller, as Apptainer does.
            Some((uid, gid)) if uid != 0 => Identity {
                uid: Some(uid),
                gid: Some(gid),
            },
            _ => Identity::default(),
        },
    };
    let mut specs = specs;
    let mut container_root: Option<(PathBuf, PathBuf)> = None;
    if let Some(c) = &container {
        if a.no_namespace {
            bail!("--image needs a private namespace (not with --no-namespace)");
        }
        let scratch = private_temp_dir()?;
        let root = scratch.join("rootfs");
        std::fs::create_dir(&root).with_context(|| format!("creating {}", root.display()))?;
        let upper = match &a.upper {
            Some(u) => u.clone(),
            None => {
                let u = scratch.join("upper");
                std::fs::create_dir(&u).with_context(|| format!("creating {}", u.display()))?;
                u
            }
        };
        // --mount destinations are paths inside the container: under its
        // root, which is mounted first.
        for s in &mut specs {
            s.dest = root.join(s.dest.strip_prefix("/").unwrap_or(&s.dest));
        }
        specs.insert(
            0,
            Spec {
                images: vec![PathBuf::from(&c.image)],
                dest: root.clone(),
                upper: Some(upper),
                record: None,
                prefetch: None,
                pin: Some(crate::trust::parse_root(&c.root)?),
            },
        );
        container_root = Some((root, scratch));
    }
    // The command gets the umask sheaf was started with (a writable mount
    // clears the process's own).
    // SAFETY: plain syscalls.
    let umask = unsafe {
        let m = libc::umask(0o022);
        libc::umask(m);
        m
    };
    // Block the forwarded signals (and SIGCHLD) before any thread exists,
    // so that only the wait loop below sees them.
    let set = signal_set();
    // SAFETY: a valid set.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    let forced_off = a.no_namespace
        || std::env::var("SHEAF_RUN_NAMESPACE").is_ok_and(|v| v == "0" || v == "off");
    // Where /dev/fuse is closed to users (mode 0600: only the setuid
    // fusermount3 opens it), a user namespace cannot mount FUSE itself: the
    // mounts are made first, by fusermount3 on private directories, and
    // copied to their destinations inside the namespace.
    // SAFETY: plain getter.
    let premount = unsafe { libc::geteuid() } != 0 && !fuse_device_usable();
    let mut temp_root: Option<PathBuf> = None;
    let mut conns: Vec<Option<(PathBuf, Connected)>> = Vec::new();
    let mut sessions = Vec::new();
    let mut env: Vec<(String, PathBuf)> = Vec::new();
    let mut result = (|| -> Result<()> {
        for s in &specs {
            if !(premount || forced_off) {
                conns.push(None);
                continue;
            }
            let root = match &temp_root {
                Some(r) => r,
                None => temp_root.insert(private_temp_dir()?),
            };
            let at = root.join(mount_dir_name(&s.dest));
            std::fs::create_dir(&at).with_context(|| format!("creating {}", at.display()))?;
            let c = sheaf_mount::serve::connect(&mount_config(s, &at, false))?;
            conns.push(Some((at, c)));
        }
        Ok(())
    })();
    let iso = if forced_off || result.is_err() {
        None
    } else {
        match namespace::enter(id) {
            Ok(iso) => Some(iso),
            Err(namespace::NamespaceError::Unavailable(why)) if id.uid.is_none() => {
                eprintln!(
                    "sheaf run: no private namespace ({why}); mounting on private temporary directories, see $SHEAF_MOUNTS"
                );
                None
            }
            Err(namespace::NamespaceError::Unavailable(why)) => {
                result = Err(anyhow!("--root / --uid-map need a user namespace: {why}"));
                None
            }
            Err(e) => {
                result = Err(e.into());
                None
            }
        }
    };
    if iso.is_none() && temp_root.is_none() && result.is_ok() {
        // Still single-threaded: the janitor may be forked.
        match private_temp_dir() {
            Ok(d) => temp_root = Some(d),
            Err(e) => result = Err(e),
        }
    }
    if forced_off && id.uid.is_some() && result.is_ok() {
        result = Err(anyhow!(
            "--root / --uid-map need a user namespace (not with --no-namespace)"
        ));
    }
    if result.is_ok() {
        result = (|| -> Result<()> {
            let mut scratch = Scratch::default();
            for (s, pre) in specs.iter().zip(conns.iter_mut()) {
                let (at, conn) = match (iso, pre.take()) {
                    (Some(_), pre) => {
                        namespace::make_dir(&s.dest, &mut scratch)?;
                        let conn = match pre {
                            Some((tmp, mut c)) => {
                                namespace::clone_mount(&tmp, &s.dest)?;
                                c.allow_all();
                                c
                            }
                            None => sheaf_mount::serve::connect(&mount_config(s, &s.dest, true))?,
                        };
                        (s.dest.clone(), conn)
                    }
                    (None, Some((tmp, c))) => {
                        env.push((s.dest.to_string_lossy().into_owned(), tmp.clone()));
                        (tmp, c)
                    }
                    (None, None) => {
                        let root = temp_root
                            .as_ref()
                            .expect("made when the namespace was refused");
                        let at = root.join(mount_dir_name(&s.dest));
                        std::fs::create_dir(&at)
                            .with_context(|| format!("creating {}", at.display()))?;
                        env.push((s.dest.to_string_lossy().into_owned(), at.clone()));
                        let c = sheaf_mount::serve::connect(&mount_config(s, &at, false))?;
                        (at, c)
                    }
                };
                // A mount copied in from outside cannot be detached from
                // here; its watchdog unmounts it when sheaf exits.
                let wait = !(iso.is_some() && premount);
                sessions.push((at.clone(), start(s, &at, conn, remote)?, wait));
            }
            Ok(())
        })();
    }
    let mut code = 125;
    let mut died_of = None;
    let mut command = a.command.clone();
    let mut chroot: Option<(std::ffi::CString, std::ffi::CString)> = None;
    let mut container_env: Vec<(String, String)> = Vec::new();
    if let (Some(c), Some((root, scratch)), true) = (&container, &container_root, result.is_ok()) {
        result = (|| -> Result<()> {
            if iso.is_none() {
                bail!("--image needs a private namespace");
            }
            let home = std::env::var_os("HOME").map(PathBuf::from);
            let cwd = std::env::current_dir().ok();
            let (binds, tmpfs) = host_dirs(home.as_deref(), cwd.as_deref(), a.no_home, a.contain);
            // SAFETY: plain getters.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            let name = match std::env::var("USER") {
                _ if uid == 0 => "root".to_string(),
                Ok(u) if !u.is_empty() => u,
                _ => format!("user{uid}"),
            };
            let user = sheaf_mount::container::User {
                name,
                uid,
                gid,
                home: home
                    .as_ref()
                    .map_or("/".into(), |h| h.to_string_lossy().into_owned()),
            };
            let notes = sheaf_mount::container::assemble(
                root,
                &sheaf_mount::container::Rootfs {
                    binds,
                    tmpfs,
                    user: Some(user),
                    scratch: scratch.clone(),
                },
            )?;
            if a.verbose && !notes.is_empty() {
                eprintln!("sheaf run: note: {}", notes.join("; "));
            }
            if command.is_empty() {
                command = c
                    .process
                    .default_command
                    .iter()
                    .map(OsString::from)
                    .collect();
                if command.is_empty() {
                    bail!(
                        "{}: the image names no command (no Entrypoint or Cmd); give one after --",
                        c.image
                    );
                }
            }
            container_env = c.process.environment(&a.env, |k| std::env::var(k).ok())?;
            let wd = std::ffi::CString::new(c.process.working_dir.as_bytes())
                .map_err(|_| anyhow!("WorkingDir has a NUL byte"))?;
            use std::os::unix::ffi::OsStrExt;
            let r = std::ffi::CString::new(root.as_os_str().as_bytes()).expect("no NUL");
            chroot = Some((r, wd));
            Ok(())
        })();
    }
    if result.is_ok() {
        let mut cmd = std::process::Command::new(&command[0]);
        cmd.args(&command[1..]);
        if chroot.is_some() {
            cmd.env_clear();
            cmd.envs(container_env.iter().map(|(k, v)| (k, v)));
        }
        if iso.is_none() && !env.is_empty() {
            let mut all = Vec::new();
            for (dest, at) in &env {
                cmd.env(env_name(Path::new(dest)), at);
                all.push(format!("{dest}={}", at.display()));
            }
            cmd.env("SHEAF_MOUNTS", all.join(";"));
        }
        let in_ns = iso.is_some();
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                libc::umask(umask);
                // The namespace (and its mounts) must not outlive sheaf: if
                // sheaf is killed, so is the command.
                if in_ns {
                    libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                }
                if let Some((root, wd)) = &chroot {
                    if libc::chroot(root.as_ptr()) != 0 || libc::chdir(c"/".as_ptr()) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    // A WorkingDir the image lacks is made, as Docker does.
                    if libc::chdir(wd.as_ptr()) != 0 {
                        libc::mkdir(wd.as_ptr(), 0o755);
                        if libc::chdir(wd.as_ptr()) != 0 {
                            return Err(std::io::Error::last_os_error());
                        }
                    }
                }
                Ok(())
            });
        }
        match cmd.spawn() {
            Ok(child) => match wait_forwarding(child.id() as libc::pid_t, &set) {
                Ok(st) => {
                    if let Some(c) = st.code() {
                        code = c;
                    } else if let Some(sig) = st.signal() {
                        died_of = Some(sig);
                        code = 128 + sig;
                    }
                }
                Err(e) => result = Err(e),
            },
            Err(e) => {
                code = if e.kind() == std::io::ErrorKind::NotFound {
                    127
                } else {
                    126
                };
                eprintln!(
                    "sheaf run: {}: {}",
                    command[0].to_string_lossy(),
                    io_text(&e)
                );
            }
        }
    }
    finish(&sessions, iso.is_some());
    result?;
    if let Some(sig) = died_of {
        die_of(sig);
    }
    Ok(code)
}

/// An I/O error without Rust's "(os error N)" suffix.
fn io_text(e: &std::io::Error) -> String {
    sheaf_format::without_os_error(&e.to_string())
}

/// A fresh directory only this user can enter, removed when sheaf exits
/// (even by kill -9) and its mounts are gone. Call while single-threaded.
fn private_temp_dir() -> Result<PathBuf> {
    let base = std::env::var_os("XDG_RUNTIME_DIR")
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .unwrap_or_else(std::env::temp_dir);
    let d = tempfile::Builder::new()
        .prefix("sheaf-run.")
        .tempdir_in(&base)
        .with_context(|| format!("creating a temporary directory in {}", base.display()))?
        .keep();
    spawn_janitor(&d)?;
    Ok(d)
}

/// Fork a process that stays outside any namespace, waits for this one to
/// end (a pipe closing), then for the mounts under `dir` to go (their
/// fusermount3 watchdogs unmount them), and removes `dir`.
fn spawn_janitor(dir: &Path) -> Result<()> {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid 2-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    // SAFETY: single-threaded (checked by the callers' order); the child
    // only reads, polls and removes files, then exits.
    match unsafe { libc::fork() } {
        -1 => bail!("fork: {}", std::io::Error::last_os_error()),
        0 => {
            // SAFETY: plain syscalls on descriptors this process owns.
            unsafe {
                libc::close(fds[1]);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                for fd in 0..3 {
                    libc::dup2(null, fd);
                }
                libc::setsid();
                let mut b = [0u8; 1];
                while libc::read(fds[0], b.as_mut_ptr().cast(), 1) != 0 {
                    if *libc::__errno_location() != libc::EINTR {
                        break;
                    }
                }
            }
            let deadline = Instant::now() + Duration::from_secs(10);
            let prefix = dir.as_os_str().as_encoded_bytes().to_vec();
            while Instant::now() < deadline {
                let busy = std::fs::read_to_string("/proc/self/mountinfo")
                    .map(|m| {
                        kernel::parse_mountinfo(&m).iter().any(|e| {
                            e.mountpoint
                                .as_os_str()
                                .as_encoded_bytes()
                                .starts_with(&prefix)
                        })
                    })
                    .unwrap_or(false);
                if !busy {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = std::fs::remove_dir_all(dir);
            // SAFETY: ending the forked child without running the parent's atexit.
            unsafe { libc::_exit(0) }
        }
        _ => {
            // SAFETY: our copy of the read end; the write end stays open
            // (close-on-exec) until this process ends.
            unsafe { libc::close(fds[0]) };
            Ok(())
        }
    }
}

/// How spec `s` is mounted at `at` (`direct`: with mount(2), inside the
/// namespace).
fn mount_config(s: &Spec, at: &Path, direct: bool) -> MountConfig {
    MountConfig {
        writable: s.upper.is_some(),
        direct,
        io_uring: false,
        mountpoint: at.to_path_buf(),
        fsname: fsname_of(&s.images),
        fs: FsConfig::default(),
        threads: 0,
        allow_other: false,
        allow_root: false,
        suid: false,
        dev: false,
        exec: true,
    }
}

/// Whether this process may open the FUSE device itself.
fn fuse_device_usable() -> bool {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/fuse")
        .is_ok()
}

/// Serve spec `s`, mounted at `at` through `conn`, from a thread.
fn start(
    s: &Spec,
    at: &Path,
    conn: Connected,
    remote: &crate::util::RemoteArgs,
) -> Result<JoinHandle<std::io::Result<()>>> {
    let policy = sheaf_trust::Policy::load(false, None, None)?;
    let mut cfg = mount_config(s, at, false);
    let a = crate::mount::assemble(crate::mount::Request {
        images: &s.images,
        upper: s.upper.as_deref(),
        mountpoint: at,
        remote,
        policy: &policy,
        pins: std::slice::from_ref(&s.pin),
        cache_size: 256 << 20,
        fs: FsConfig {
            prefetch_threads: 1,
            prefetch_blocks: 1,
            record: s.record.clone(),
            ..Default::default()
        },
        prefetch_metadata: None,
        prefetch: s.prefetch.as_deref(),
    })?;
    let mounted = match a.served {
        crate::mount::Served::Image { img, src, fs } => {
            cfg.fs = fs.clone();
            sheaf_mount::serve::attach(&cfg, conn, SheafFs::new(img, src, fs))?.spawn()
        }
        crate::mount::Served::Union(fs) => sheaf_mount::serve::attach(&cfg, conn, *fs)?.spawn(),
    };
    mounted.with_context(|| format!("serving {}", s.dest.display()))
}

/// Wait for `pid`, passing on the signals sheaf receives from other
/// processes (a terminal's signals reach the command directly).
fn wait_forwarding(pid: libc::pid_t, set: &libc::sigset_t) -> Result<std::process::ExitStatus> {
    loop {
        let mut status = 0;
        // SAFETY: plain syscall on our child.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            return Ok(std::process::ExitStatus::from_raw(status));
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(libc::EINTR) {
                bail!("waiting for the command: {e}");
            }
        }
        // SAFETY: zeroed siginfo is a valid out-parameter.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let ts = libc::timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        // SAFETY: valid set, out-pointer and timeout.
        let sig = unsafe { libc::sigtimedwait(set, &mut info, &ts) };
        if sig > 0 && sig != libc::SIGCHLD && info.si_code <= 0 {
            // SAFETY: plain syscall.
            unsafe { libc::kill(pid, sig) };
        }
    }
}

/// Detach every mount and give the sessions a moment to end.
fn finish(sessions: &[(PathBuf, JoinHandle<std::io::Result<()>>, bool)], in_ns: bool) {
    // Last mounted first: with --image, the --mount mounts are inside the
    // container's root.
    for (at, _, _) in sessions.iter().rev() {
        let r = if in_ns {
            namespace::detach(at).map_err(|e| e.to_string())
        } else {
            kernel::unmount(at, true).map_err(|e| e.to_string())
        };
        if let Err(e) = r {
            eprintln!("sheaf run: unmounting {}: {e}", at.display());
        }
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    while sessions
        .iter()
        .any(|(_, h, wait)| *wait && !h.is_finished())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Die of signal `sig`, as the command did.
fn die_of(sig: libc::c_int) -> ! {
    // SAFETY: plain syscalls; this process is about to end.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, sig);
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
        libc::kill(libc::getpid(), sig);
    }
    std::process::exit(128 + sig)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_from_the_right() {
        let s = parse_spec("http://h:8080/a.sheaf:/data:upper=/tmp/u").unwrap();
        assert_eq!(s.images, vec![PathBuf::from("http://h:8080/a.sheaf")]);
        assert_eq!(s.dest, PathBuf::from("/data"));
        assert_eq!(s.upper, Some(PathBuf::from("/tmp/u")));
        let s = parse_spec("nonexistent-a.sheaf,nonexistent-b.sheaf:/opt/x").unwrap();
        assert_eq!(s.images.len(), 2);
        let e = |x: &str| parse_spec(x).unwrap_err().to_string();
        assert!(e("a.sheaf:data").contains("absolute"));
        assert!(e("a.sheaf:/").contains("over /"));
        assert!(e(":/data").contains("IMAGE:DEST"));
        assert!(e("a.sheaf:/d:bogus=1").contains("unknown option"));
        assert!(e("a,b:/d:record=/x").contains("single"));
        assert!(e("tree.sheaf").contains("missing :DEST"));
        assert!(e("http://h/a.sheaf").contains("missing :DEST"));
        assert!(e("http://h:8080/a.sheaf").contains("missing :DEST"));
    }

    #[test]
    fn env_names_are_shell_words() {
        assert_eq!(env_name(Path::new("/data")), "SHEAF_MOUNT_DATA");
        assert_eq!(
            env_name(Path::new("/opt/my-stack/")),
            "SHEAF_MOUNT_OPT_MY_STACK"
        );
    }
}
