//! `sheaf mount`, `sheaf umount`, `sheaf stats` and the `mount.fuse.sheaf`
//! helper that mount(8) runs for `-t fuse.sheaf` and fstab entries.

pub(crate) use crate::options::absolute;
use crate::options::MountOptions;
use crate::serve::{serve_image, serve_mount};
use crate::util::{human, RemoteArgs};
use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use sheaf_mount::serve::check_mountpoint;
use sheaf_mount::{kernel, FsConfig, UnionConfig, UnionFs};
use sheaf_read::{CountingSource, Image, ImageOptions, Source};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

const MOUNT_OPTIONS_HELP: &str = "\
Mount options (-o, comma-separated, repeatable):
  mem_cache=SIZE    memory for decompressed blocks (default 256M; e.g. 64M, 2G;
                    also cache_size=, its old name; the disk cache of remote
                    images is cache_quota= / --cache-size)
  threads=N         request threads (default: 4 per core, 8..32)
  readahead=N       blocks decompressed ahead of a sequential reader (default 1; 0 = off)
  readdirplus=WHEN  list directories with attributes: auto (default), always, never
  io_uring=auto|off take requests through FUSE over io_uring where the kernel offers
                    it (Linux 6.14+, /sys/module/fuse/parameters/enable_uring = Y):
                    per-CPU queues, one syscall per round trip (default auto;
                    single-image mounts; /dev/fuse otherwise)
  uid=N, gid=N      present every entry as owned by this user / group
  allow_other       let other users in (non-root: needs user_allow_other in /etc/fuse.conf)
  allow_root        let root in
  suid, dev         honour setuid bits / device files (root only; default nosuid,nodev)
  noexec, exec      forbid / allow (the default) running programs from the mount
  log=FILE          append messages to FILE (default: syslog, `journalctl -t sheaf`;
                    without one (no /dev/log), /var/log/sheaf/MOUNT.log for root,
                    ~/.local/state/sheaf/log/MOUNT.log for users)
  debug             log every request (with -f: to stderr)
  record=FILE       at unmount, write the paths of the files read, in first-read order
  prefetch=FILE     fetch the blocks of the files listed in FILE (one path per line,
                    e.g. from record=) in the background, with large parallel requests
                    (default: the list stored by `sheaf build --prefetch`; none = off)
  prefetch_metadata=on|off
                    fetch all metadata pages in the background at mount (default: on
                    for URLs, off for files)
  kernel[=auto|require|off]
                    (root) the kernel's EROFS driver serves the tree from a metadata
                    image made once per image; sheaf serves the data, lazy and
                    verified; auto falls back to FUSE with one line saying why,
                    require fails instead (also --kernel[=WHEN]; docs/mount.md)
  kernel_cache=DIR  where the kernel path keeps metadata images
                    (default /var/cache/sheaf/kernel, root's alone)
  ro, defaults, auto, noauto, user, users, nouser, nofail, _netdev, x-*, comment=*
                    accepted for fstab and ignored (the mount is always read-only)

The mount is read-only (writes fail with EROFS) unless --upper DIR is given:
then new and changed files go to DIR (whole-file copy-up on the first change,
deletions as .wh.NAME whiteouts), the images never change, and
`sheaf commit DIR -o LAYER` packs the changes as a layer. Several images are
stacked bottom first, later ones winning (OCI whiteouts honoured, never shown).
The kernel caches entries, attributes, listings and file pages forever.

Logs: with -f, stderr; otherwise the file given with log=FILE, else syslog,
else a log file (see log= above). `sheaf stats MOUNTPOINT` says where, and
lists the last errors readers met with the paths they were reading.

Remote images (URLs) use the node cache and network flags shared by all
commands (see 'sheaf --help'); as mount options, for fstab:
  cache_dir=DIR     node cache (--cache-dir)
  cache_quota=SIZE  its size quota (--cache-size; mem_cache= is the memory cache)
  no_cache          fetch every read (--no-cache)
  mirror=URL        another URL of the same image (repeatable; --mirror)
  proxy=P1;P2;DIRECT  proxies in order, ';'-separated (--proxy)
  timeout=SECS, failback=SECS  (--timeout, --failback)

In /etc/fstab (mount(8) runs /sbin/mount.fuse.sheaf, a link to this program
installed by `make install`):
  /images/stack.sheaf  /opt/stack  fuse.sheaf  defaults,allow_other,mem_cache=1G  0 0

Examples:
  sheaf mount data.sheaf /mnt/data && ls /mnt/data
  sheaf mount -o mem_cache=1G,allow_other stack.sheaf /opt/stack
  sheaf mount --kernel dataset.sheaf /data             (root: EROFS in the kernel)
  sheaf mount site.sheaf project.sheaf /opt/sw          (a union, read-only)
  sheaf mount base.sheaf /work --upper changes/          (writable overlay)
  sheaf stats /mnt/data
  sheaf umount /mnt/data";

/// Arguments of `sheaf mount`.
#[derive(Args, Debug)]
#[command(
    after_long_help = MOUNT_OPTIONS_HELP,
    override_usage = "sheaf mount [OPTIONS] IMAGE... MOUNTPOINT"
)]
pub struct MountArgs {
    /// The image(s) to mount (files or http(s):// URLs, fetched lazily),
    /// then an existing directory to mount on (what it holds is hidden while mounted). Several images are
    /// stacked bottom first, later ones winning (also as BASE,LAYER,...).
    #[arg(required_unless_present = "request", num_args = 1.., value_name = "PATH")]
    paths: Vec<PathBuf>,
    /// Make the mount writable: new and changed files go to DIR (an
    /// existing directory; whiteouts record deletions), the images never
    /// change. One writer per DIR; `sheaf commit DIR -o LAYER` packs it.
    #[arg(long, value_name = "DIR")]
    upper: Option<PathBuf>,
    /// Mount options, comma-separated (see below).
    #[arg(short = 'o', value_name = "OPTS")]
    options: Vec<String>,
    /// Serve the tree from the kernel's EROFS driver (root): lookups and
    /// listings at kernel speed, the data still read and verified by sheaf.
    /// WHEN: auto (the default: FUSE, with a line saying why, where the
    /// kernel path cannot be taken) or require (fail instead). Also -o kernel.
    #[arg(long, value_name = "WHEN", num_args = 0..=1, require_equals = true,
          default_missing_value = "auto", value_parser = ["auto", "require", "off"])]
    kernel: Option<String>,
    /// Stay in the foreground and log to stderr (default: return once the
    /// mount is ready and serve it from a background process).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Once the mount is ready, print it as JSON on stdout: mountpoint,
    /// pid of the serving process, images, their root digests, and the
    /// milliseconds it took (not with -f).
    #[arg(long, conflicts_with = "foreground")]
    json: bool,
    /// Refuse the image unless its root digest is ROOT (64 hex digits, as
    /// `sheaf root` prints): what was checked once is what is mounted, even
    /// if the server changes it. Once per image, in order (`-`: not pinned).
    #[arg(long = "pin", value_name = "ROOT")]
    pins: Vec<String>,
    /// Take what to mount from a mount request (JSON, `-` for standard
    /// input), as `pool load` and the snapshotter hand it to their child:
    /// images pinned to checked roots, the mount point, the upper
    /// directory and the allow_other/suid/dev switches. -o adds options.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["paths", "pins", "upper"])]
    request: Option<PathBuf>,
    /// The first open of a URL image waits, with the usual backoff, up to
    /// --timeout for a server that refuses or does not answer, instead of
    /// failing at once (as for a server lost after it was reached; e.g. a
    /// job starting while the web server restarts). 404/403, a bad
    /// certificate or an ssh authentication failure still fail at once.
    #[arg(long)]
    wait_for_server: bool,
    #[command(flatten)]
    policy: crate::util::PolicyArgs,
}

/// Arguments of `sheaf umount`.
#[derive(Args, Debug)]
pub struct UmountArgs {
    /// Where the image is mounted.
    mountpoint: PathBuf,
    /// Detach now even if files are open; the mount goes away when they close.
    #[arg(short = 'z', long)]
    lazy: bool,
}

/// Open an image for mounting, counting the bytes read from it.
pub(crate) fn open_image(
    path: &Path,
    remote: &RemoteArgs,
    cache: usize,
) -> Result<(Arc<Image>, Arc<CountingSource>)> {
    let mut counting = None;
    let img = crate::util::open_image_with(
        path,
        remote,
        ImageOptions {
            block_cache_bytes: cache,
            ..Default::default()
        },
        |inner| {
            let c = Arc::new(CountingSource::new(inner));
            counting = Some(c.clone());
            c as Arc<dyn Source>
        },
    )?;
    let src = counting.expect("wrap is called");
    // Read the root now: a corrupt metadata root is refused before mounting.
    img.root()?;
    Ok((Arc::new(img), src))
}

/// `sheaf mount`.
pub fn run(mut a: MountArgs, remote: &RemoteArgs) -> Result<i32> {
    if let Some(when) = a.kernel.take() {
        a.options.push(format!("kernel={when}"));
    }
    let remote = &RemoteArgs {
        wait_for_server: remote.wait_for_server || a.wait_for_server,
        ..remote.clone()
    };
    let policy = a.policy.load()?;
    if let Some(file) = &a.request {
        return mount_request(file, &a, &policy, remote);
    }
    if a.paths.len() < 2 {
        // A usage error (exit 2), said as what is missing.
        eprintln!(
            "sheaf: error: missing the mount point: sheaf mount {} MOUNTPOINT (an existing directory; see 'sheaf mount --help')",
            a.paths
                .first()
                .map_or(String::new(), |p| p.display().to_string())
        );
        return Ok(2);
    }
    let (mountpoint, images) = a.paths.split_last().expect("two or more");
    let images = crate::util::split_layers(images);
    if a.pins.len() > images.len() {
        bail!(
            "--pin is given {} times for {} images",
            a.pins.len(),
            images.len()
        );
    }
    let pins = a
        .pins
        .iter()
        .map(|p| match p.as_str() {
            "-" => Ok(None),
            p => crate::trust::parse_root(p).map(Some),
        })
        .collect::<Result<Vec<_>>>()?;
    let started = Instant::now();
    let target = Target {
        images: &images,
        pins: &pins,
        upper: a.upper.as_deref(),
        mountpoint,
    };
    let secret = |u: &str| sheaf_net::SecretUrl::new(u).has_secret();
    let routes = remote.with_options(&MountOptions::parse(&a.options, false)?.remote);
    if (images.iter().any(|i| secret(&i.to_string_lossy()))
        || routes.mirrors.iter().any(|m| secret(m))
        || routes
            .proxy
            .as_deref()
            .is_some_and(|p| p.split(',').any(secret)))
        && running_as_sheaf()
    {
        return reexec_with_request(&target, &a, remote);
    }
    let code = mount(&target, &a.options, a.foreground, false, &policy, remote)?;
    if a.json && code == 0 {
        print_mounted(mountpoint, &images, started)?;
    }
    Ok(code)
}

/// `sheaf mount --json`: what is mounted, read back from the mount itself
/// (its statistics report), so the line says what is served.
fn print_mounted(mountpoint: &Path, images: &[PathBuf], started: Instant) -> Result<()> {
    let mp = absolute(mountpoint);
    let ms = started.elapsed().as_secs_f64() * 1e3;
    let line = match kernel::mount_at(&mp)? {
        // The kernel path has no control file: what it serves is in its
        // source's name, the root digest it was made from.
        Some(m) if m.is_kernel_path() => MountedLine {
            images: images.iter().map(|i| i.display().to_string()).collect(),
            kernel: true,
            ms,
            mountpoint: mp,
            pid: crate::serve::last_server().unwrap_or(0),
            roots: Path::new(&m.source)
                .file_name()
                .and_then(|n| n.to_str()?.split('.').next().map(String::from))
                .into_iter()
                .collect(),
            writable: false,
        },
        _ => {
            let r = report(&mp)?;
            MountedLine {
                images: r.layers.unwrap_or_else(|| vec![r.image]),
                kernel: false,
                ms,
                mountpoint: mp,
                pid: r.pid,
                roots: r.roots,
                writable: r.upper.unwrap_or(false),
            }
        }
    };
    println!("{}", serde_json::to_string(&line)?);
    Ok(())
}

/// The line `sheaf mount --json` prints (docs/json.md); fields in the
/// order it has always printed them (sorted).
#[derive(serde::Serialize)]
struct MountedLine {
    images: Vec<String>,
    /// Served by the kernel's EROFS driver (`--kernel`).
    kernel: bool,
    ms: f64,
    mountpoint: PathBuf,
    pid: u32,
    roots: Vec<String>,
    writable: bool,
}

/// `sheaf mount URL MP` where a URL carries a secret (`user:password@`, a
/// presigned query): the secret is in this process's command line, which
/// `ps` shows every user for as long as the process lives, and the process
/// that serves the mount would be this one (forked). So this process runs
/// `sheaf mount --request -` in its place (exec: the same pid, a new
/// command line) with the typed request, secrets and all, on standard
/// input (a memfd, read once and closed): the serving process's
/// /proc/PID/cmdline and environ hold no secret.
fn reexec_with_request(t: &Target<'_>, a: &MountArgs, remote: &RemoteArgs) -> Result<i32> {
    use std::io::{Seek, Write};
    use std::os::unix::process::CommandExt;
    let images = t
        .images
        .iter()
        .enumerate()
        .map(|(i, p)| sheaf_mount::request::RequestImage {
            source: p.to_string_lossy().into_owned(),
            root: t.pins.get(i).copied().flatten(),
        })
        .collect();
    let mut req = sheaf_mount::MountRequest::new(images, absolute(t.mountpoint));
    req.upper = t.upper.map(absolute);
    // The routes from the flags and from -o, all in the request.
    remote
        .with_options(&MountOptions::parse(&a.options, false)?.remote)
        .put_routes(&mut req);
    // SAFETY: memfd_create with a valid name; the descriptor is ours.
    let fd = unsafe { libc::memfd_create(c"sheaf-mount-request".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        bail!("memfd_create: {}", std::io::Error::last_os_error());
    }
    // SAFETY: memfd_create just returned it.
    let mut f = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    f.write_all(&req.encode())?;
    f.rewind()?;
    let exe = std::env::current_exe().context("this program's path")?;
    let mut cmd = std::process::Command::new(&exe);
    cmd.args(remote.to_args_without_routes())
        .args(["mount", "--request", "-"]);
    for o in &a.options {
        let kept: Vec<&str> = o
            .split(',')
            .map(str::trim)
            .filter(|x| !x.starts_with("mirror=") && !x.starts_with("proxy="))
            .collect();
        if !kept.is_empty() {
            cmd.arg("-o").arg(kept.join(","));
        }
    }
    if a.foreground {
        cmd.arg("-f");
    }
    if a.json {
        cmd.arg("--json");
    }
    let pa = &a.policy;
    if pa.require_signature {
        cmd.arg("--require-signature");
    }
    if let Some(s) = &pa.signers {
        cmd.arg("--signers").arg(s);
    }
    if let Some(i) = &pa.identity {
        cmd.arg("--identity").arg(i);
    }
    cmd.stdin(std::process::Stdio::from(f));
    let err = cmd.exec();
    bail!("{}: {err}", exe.display())
}

/// Whether this process is a sheaf program (not a test harness running the
/// command line in-process, which must not be replaced).
fn running_as_sheaf() -> bool {
    std::env::current_exe().is_ok_and(|e| {
        e.file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("sheaf"))
    })
}

/// `sheaf mount --request FILE`: the typed request of a parent process.
fn mount_request(
    file: &Path,
    a: &MountArgs,
    policy: &sheaf_trust::Policy,
    remote: &RemoteArgs,
) -> Result<i32> {
    use std::io::Read;
    let mut bytes = Vec::new();
    let limit = sheaf_mount::request::MAX_REQUEST_LEN as u64 + 1;
    if file == Path::new("-") {
        std::io::stdin()
            .lock()
            .take(limit)
            .read_to_end(&mut bytes)
            .context("reading the mount request from standard input")?;
    } else {
        std::fs::File::open(file)
            .and_then(|f| f.take(limit).read_to_end(&mut bytes))
            .with_context(|| file.display().to_string())?;
    }
    let started = Instant::now();
    let r = sheaf_mount::MountRequest::decode(&bytes)?;
    let remote = &remote.with_routes(&r);
    let images: Vec<PathBuf> = r.images.iter().map(|i| PathBuf::from(&i.source)).collect();
    // The site's switch comes first: -o given here still wins.
    // SAFETY: a plain getter.
    let mut options = if unsafe { libc::geteuid() } == 0 {
        crate::options::site_mount_options(&sheaf_trust::policy::site_config()?)?
    } else {
        Vec::new()
    };
    options.extend(a.options.iter().cloned());
    for (on, name) in [
        (r.allow_other, "allow_other"),
        (r.suid, "suid"),
        (r.dev, "dev"),
    ] {
        if on {
            options.push(name.to_string());
        }
    }
    let code = mount(
        &Target {
            images: &images,
            pins: &r.pins(),
            upper: r.upper.as_deref(),
            mountpoint: &r.mountpoint,
        },
        &options,
        a.foreground,
        false,
        policy,
        remote,
    )?;
    if a.json && code == 0 {
        print_mounted(&r.mountpoint, &images, started)?;
    }
    Ok(code)
}

/// What `mount` mounts where.
struct Target<'a> {
    images: &'a [PathBuf],
    pins: &'a [Option<sheaf_format::Digest>],
    upper: Option<&'a Path>,
    mountpoint: &'a Path,
}

/// Check that the sheaf mount at `mp` may stand for a mount of `roots`
/// (the root digests of its images, bottom first): made by this user and
/// serving exactly those images. Whoever finds a mount where it would
/// mount (pool load, ranks sharing a node) uses it only after this; a
/// neighbour's mount, or another image, is refused in one line.
pub(crate) fn check_existing(mp: &Path, roots: &[sheaf_format::Digest]) -> Result<()> {
    let Some(m) = kernel::mount_at(mp)? else {
        bail!("{}: nothing is mounted there", mp.display());
    };
    // SAFETY: plain getter.
    let me = unsafe { libc::geteuid() };
    // A kernel-path mount of one image: only root mounts EROFS, and its
    // source names the root digest it was made from.
    if me == 0 && m.is_kernel_path() {
        let name = Path::new(&m.source)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        if let [root] = roots {
            if name.starts_with(&sheaf_format::hex(root)) {
                return Ok(());
            }
        }
        bail!(
            "{}: a kernel-path mount of another image is there: refusing to use it (sheaf umount {})",
            mp.display(),
            mp.display()
        );
    }
    if m.fstype != "fuse.sheaf" || m.owner != Some(me) {
        bail!(
            "{}: a {} mount made by {} is there, not yours: refusing to use it (ask its owner to unmount it, or choose another mount point)",
            mp.display(),
            m.fstype,
            m.owner.map_or("an unknown user".to_string(), |u| format!("uid {u}"))
        );
    }
    let r = report(mp).map_err(|_| {
        anyhow!(
            "{}: the sheaf mount there does not answer: refusing to use it (sheaf umount {})",
            mp.display(),
            mp.display()
        )
    })?;
    let want: Vec<String> = roots.iter().map(|d| sheaf_format::hex(d)).collect();
    if r.roots != want {
        bail!(
            "{}: the mount there serves root digest {}, not {}: refusing to use it (sheaf umount {}, then try again)",
            mp.display(),
            if r.roots.is_empty() { "unknown".to_string() } else { r.roots.join(",") },
            want.join(","),
            mp.display()
        );
    }
    Ok(())
}

/// What a mount serves, assembled by [`assemble`].
pub(crate) enum Served {
    /// One image, read-only. `SheafFs::new` runs where the mount is served
    /// (after the fork that daemonises it: it starts threads).
    Image {
        img: Arc<Image>,
        src: Arc<CountingSource>,
        fs: FsConfig,
    },
    /// A stack of images, writable with an upper directory.
    Union(Box<UnionFs>),
}

/// A filesystem ready to serve, its name for /proc/mounts, and who signed it
/// (for the log).
pub(crate) struct Assembly {
    pub served: Served,
    pub fsname: String,
    pub signer: String,
}

/// What to mount, as `sheaf mount` and `sheaf run` both describe it.
pub(crate) struct Request<'a> {
    pub images: &'a [PathBuf],
    pub upper: Option<&'a Path>,
    /// The mount point (canonical), which an upper directory must not
    /// contain or be inside.
    pub mountpoint: &'a Path,
    pub remote: &'a RemoteArgs,
    pub policy: &'a sheaf_trust::Policy,
    /// The root digest each image must have (by position; shorter or
    /// empty: not pinned), decided where it was opened first
    /// ([`crate::trust::check_pin`]).
    pub pins: &'a [Option<sheaf_format::Digest>],
    /// Decoded-block cache per image.
    pub cache_size: usize,
    /// Settings of a single-image mount; its prefetch list and metadata
    /// prefetch are decided here.
    pub fs: FsConfig,
    /// Prefetch metadata in the background (default: for URLs).
    pub prefetch_metadata: Option<bool>,
    /// A list of paths whose blocks to fetch first (`none`: nothing;
    /// default: the image's own prefetch list).
    pub prefetch: Option<&'a Path>,
}

/// The one mount assembly of `sheaf mount` and `sheaf run`: open the images
/// (files or URLs), apply the signature policy, and choose the filesystem
/// (one image: `SheafFs`; several, or an upper directory: `UnionFs`).
pub(crate) fn assemble(r: Request<'_>) -> Result<Assembly> {
    if r.images.len() == 1 && r.upper.is_none() {
        let image = &r.images[0];
        let (img, src) = open_image(image, r.remote, r.cache_size)?;
        crate::trust::check_pin(&img, r.pins.first().and_then(Option::as_ref))?;
        let signer = crate::trust::enforce(r.policy, &img, image)?
            .map(|v| {
                format!(
                    "; signature trusted: {} ({})",
                    v.principals.join(", "),
                    v.fingerprint
                )
            })
            .unwrap_or_default();
        let remote = sheaf_net::is_url(&image.to_string_lossy());
        let fsname = fsname_of(std::slice::from_ref(image));
        let fs = crate::serve::image_fs(&img, r.fs, r.prefetch_metadata, r.prefetch, remote)?;
        return Ok(Assembly {
            served: Served::Image { img, src, fs },
            fsname,
            signer,
        });
    }
    if r.fs.record.is_some() || r.prefetch.is_some() {
        bail!("mount options record= and prefetch= apply to a single image");
    }
    let (fs, fsname, signer) = union_fs(
        r.images,
        r.pins,
        r.upper,
        r.mountpoint,
        r.remote,
        r.cache_size,
        r.policy,
    )?;
    Ok(Assembly {
        served: Served::Union(Box::new(fs)),
        fsname,
        signer,
    })
}

fn mount(
    t: &Target<'_>,
    options: &[String],
    foreground: bool,
    from_fstab: bool,
    policy: &sheaf_trust::Policy,
    remote: &RemoteArgs,
) -> Result<i32> {
    let started = Instant::now();
    let p = MountOptions::parse(options, from_fstab)?;
    let remote = remote.with_options(&p.remote);
    let (images, upper) = (t.images, t.upper);
    sheaf_mount::serve::check_order(images, t.mountpoint)?;
    let mp = check_mountpoint(t.mountpoint)?;
    if sheaf_mount::serve::hides_entries(&mp) {
        eprintln!(
            "sheaf: warning: {} is not empty: what it holds is hidden while the image is mounted",
            t.mountpoint.display()
        );
    }
    let a = assemble(Request {
        images,
        upper,
        mountpoint: &mp,
        remote: &remote,
        policy,
        pins: t.pins,
        cache_size: p.cache_size,
        fs: p.fs_config(),
        prefetch_metadata: p.prefetch_metadata,
        prefetch: p.prefetch.as_deref(),
    })?;
    let cfg = p.mount_config(mp, a.fsname, upper.is_some());
    let layers = match &a.served {
        Served::Image { img, .. } => vec![img.clone()],
        Served::Union(fs) => fs.layers(),
    };
    let writable = upper.is_some();
    if let Some(code) =
        sheaf_front::kernel::mount(&cfg, &p, &layers, writable, &a.signer, foreground)?
    {
        return Ok(code);
    }
    match a.served {
        Served::Image { img, src, fs } => {
            serve_image(cfg, &p, &a.signer, started, foreground, img, src, fs)
        }
        Served::Union(fs) => serve_mount(&cfg, &p, &a.signer, started, foreground, move || *fs),
    }
}

/// A union of `images` (bottom first) for mountpoint `mp`, writable through
/// `upper` (locked for this process and its children): the filesystem, its
/// name for `/proc/mounts`, and the trusted signers for the log.
pub(crate) fn union_fs(
    images: &[PathBuf],
    pins: &[Option<sheaf_format::Digest>],
    upper: Option<&Path>,
    mp: &Path,
    remote: &RemoteArgs,
    cache_size: usize,
    policy: &sheaf_trust::Policy,
) -> Result<(UnionFs, String, String)> {
    let mut layers = Vec::new();
    let mut signers = Vec::new();
    for (i, image) in images.iter().enumerate() {
        let (img, _src) = open_image(image, remote, cache_size)?;
        crate::trust::check_pin(&img, pins.get(i).and_then(Option::as_ref))?;
        if let Some(v) = crate::trust::enforce(policy, &img, image)? {
            signers.push(format!("{} ({})", v.principals.join(", "), v.fingerprint));
        }
        layers.push(img);
    }
    let signer = if signers.is_empty() {
        String::new()
    } else {
        format!("; signatures trusted: {}", signers.join("; "))
    };
    let (upper, lock) = match upper {
        None => (None, None),
        Some(dir) => {
            let abs = dir
                .canonicalize()
                .with_context(|| format!("upper directory {}", dir.display()))?;
            if !abs.is_dir() {
                bail!("upper directory {}: not a directory", dir.display());
            }
            if abs.starts_with(mp) || mp.starts_with(&abs) {
                bail!(
                    "upper directory {} and mountpoint {} must not contain each other",
                    dir.display(),
                    mp.display()
                );
            }
            let lock = sheaf_format::layers::lock(&abs, true)?;
            (Some(abs), Some(lock))
        }
    };
    let fs = UnionFs::new(
        layers,
        UnionConfig {
            upper,
            upper_lock: lock,
        },
    )?;
    Ok((fs, fsname_of(images), signer))
}

/// The mount source shown in `/proc/mounts`: the images, absolute,
/// `:`-joined; for a long stack, the first and last and how many (the
/// kernel refuses mount options past a page).
pub(crate) fn fsname_of(images: &[PathBuf]) -> String {
    let names: Vec<String> = images
        .iter()
        .map(|i| {
            if sheaf_net::is_url(&i.to_string_lossy()) {
                sheaf_net::redact(&i.to_string_lossy())
            } else {
                crate::options::local_fsname(i)
            }
        })
        .collect();
    let all = names.join(":");
    if all.len() <= 1024 || names.len() < 3 {
        return all;
    }
    format!(
        "{}:...({} layers):{}",
        names[0],
        names.len() - 2,
        names[names.len() - 1]
    )
}

/// `sheaf umount`: no output but its error (fusermount3's message comes
/// back in it), which [`crate::run`] writes through the [`crate::Io`].
pub fn umount(a: UmountArgs) -> Result<i32> {
    let mp = absolute(&a.mountpoint);
    if std::fs::symlink_metadata(&mp).is_err_and(|e| e.kind() == std::io::ErrorKind::NotFound) {
        bail!(
            "{}: no such file or directory (nothing is mounted there)",
            a.mountpoint.display()
        );
    }
    let Some(m) = kernel::mount_at(&mp)? else {
        bail!("{}: not mounted", a.mountpoint.display());
    };
    let kernel_path = m.is_kernel_path();
    if !m.is_sheaf() {
        bail!(
            "{}: not a sheaf mount ({} from {}); use umount(8)",
            a.mountpoint.display(),
            m.fstype,
            m.source
        );
    }
    // A kernel-path mount has no control file: its server ends with it.
    let pid = if kernel_path {
        None
    } else {
        sheaf_mount::control::Client::connect(&mp).pid().ok()
    };
    kernel::unmount(&mp, a.lazy).map_err(|e| {
        if e.errno() == Some(libc::EBUSY) {
            anyhow!(
                "{}: busy (files or directories on it are in use); close them, or use --lazy to detach it now",
                a.mountpoint.display()
            )
        } else {
            anyhow!("{}: {e}", a.mountpoint.display())
        }
    })?;
    // Wait for the serving process, so that a script's next step sees it gone.
    if let Some(pid) = pid {
        sheaf_mount::control::wait_exit(pid, Duration::from_secs(10));
    }
    Ok(0)
}

/// The statistics a mount's server reports: what `stats`, `mount --json`
/// and a check of a mount found in place read.
fn report(mountpoint: &Path) -> Result<sheaf_mount::stats::Report> {
    Ok(sheaf_mount::control::Client::connect(mountpoint).report()?)
}

/// `sheaf stats`.
pub fn stats(mountpoint: &Path, json: bool, io: &mut crate::Io<'_>) -> Result<i32> {
    use std::io::Write;
    if kernel::mount_at(&absolute(mountpoint))?.is_some_and(|m| m.is_kernel_path()) {
        bail!(
            "{}: a kernel-path mount (sheaf mount --kernel): the kernel's EROFS serves it and sheaf keeps no statistics for it",
            mountpoint.display()
        );
    }
    let s = report(mountpoint)?;
    if json {
        writeln!(io.stdout, "{}", s.to_json_pretty())?;
        return Ok(0);
    }
    writeln!(io.stdout, "image             {}", s.image)?;
    if let Some(layers) = &s.layers {
        writeln!(
            io.stdout,
            "layers            {} ({}){}",
            layers.len(),
            if s.upper == Some(true) {
                "writable"
            } else {
                "read-only"
            },
            s.copy_ups
                .map(|n| format!("; {n} copied up"))
                .unwrap_or_default()
        )?;
    }
    writeln!(io.stdout, "serving pid       {}", s.pid)?;
    writeln!(io.stdout, "uptime            {:.1} s", s.uptime_s)?;
    if s.io_uring_requests > 0 {
        writeln!(
            io.stdout,
            "transport         FUSE over io_uring ({} requests)",
            s.io_uring_requests
        )?;
    } else {
        writeln!(io.stdout, "transport         /dev/fuse")?;
    }
    if let (Some(bytes), Some(reads)) = (s.image_bytes_read, s.image_reads) {
        writeln!(
            io.stdout,
            "read from image   {} in {reads} requests",
            human(bytes)
        )?;
    }
    writeln!(io.stdout, "served to readers {}", human(s.bytes_served))?;
    let b = &s.block_cache;
    writeln!(io.stdout,
        "block cache       {} of {}; {} hits, {} misses (blocks decompressed: {}, {} of them a prefix decoded further), {} waits, {} evictions",
        human(b.size),
        human(b.capacity.unwrap_or(0)),
        b.hits,
        b.misses,
        human(b.loaded_bytes),
        b.extensions,
        b.waits,
        b.evictions.unwrap_or(0)
    )?;
    if let Some(p) = &s.prefetch {
        writeln!(io.stdout,
            "readahead         {} blocks queued, {} dropped, {} read in part finished on a spare CPU; background prefetch {}",
            p.queued,
            p.dropped,
            p.completions,
            human(p.background_bytes)
        )?;
    }
    if let Some(n) = s.nodes {
        writeln!(io.stdout, "nodes held        {n}")?;
    }
    if let Some(r) = &s.remote {
        match &r.transport {
            None if r.offline => writeln!(
                io.stdout,
                "network           offline: serving from the node cache only"
            )?,
            t => {
                let t = t.as_ref().map(|t| t.summary()).unwrap_or_default();
                writeln!(io.stdout,
                    "network           {} fetched in {} requests; {} retries ({:.1} s waiting), {} failovers, {} errors",
                    human(t.bytes),
                    t.requests,
                    t.retries,
                    t.wait_ms as f64 / 1000.0,
                    t.failovers,
                    t.errors
                )?;
                writeln!(io.stdout, "route             {}", t.route)?;
                if !t.last_error.is_empty() {
                    writeln!(io.stdout, "last net error    {}", t.last_error)?;
                }
            }
        }
    }
    if let Some(c) = &s.disk_cache {
        // A repository read in place has no counters.
        let c = match c {
            sheaf_read::StoreStats::NodeCache(c) => c.clone(),
            sheaf_read::StoreStats::Repository { .. } => sheaf_read::CacheStats {
                dir: "?".into(),
                ..Default::default()
            },
        };
        writeln!(
            io.stdout,
            "node cache        {}: {} hits, {} misses, {} stored, {} bad dropped, {} write errors",
            c.dir, c.hits, c.misses, c.stored, c.bad, c.write_errors
        )?;
    }
    writeln!(io.stdout, "image errors      {}", s.image_errors)?;
    if let Some(l) = &s.log {
        writeln!(io.stdout, "log               {l}")?;
    }
    if !s.recent_errors.is_empty() {
        writeln!(io.stdout, "recent errors (oldest first):")?;
        for e in &s.recent_errors {
            writeln!(
                io.stdout,
                "  {} {} {}: {}",
                crate::find::local_time(e.unix_time as i64, "%F %T"),
                e.op,
                e.path.as_deref().unwrap_or("?"),
                e.error
            )?;
        }
    }
    writeln!(
        io.stdout,
        "{:<12} {:>10} {:>7} {:>9} {:>9} {:>9} {:>9}",
        "op", "count", "errors", "mean µs", "p50 µs≤", "p99 µs≤", "max µs"
    )?;
    for (name, o) in &s.ops {
        writeln!(
            io.stdout,
            "{:<12} {:>10} {:>7} {:>9.1} {:>9} {:>9} {:>9.0}",
            name, o.count, o.errors, o.mean_us, o.p50_us_le, o.p99_us_le, o.max_us
        )?;
    }
    Ok(0)
}

/// Entry point when run as `mount.fuse.sheaf` / `mount.sheaf` by mount(8):
/// `mount.fuse.sheaf IMAGE MOUNTPOINT [-o OPTS] [-n] [-s] [-f] [-v] [-t TYPE]`.
pub fn mount_helper(args: Vec<OsString>) -> Result<i32> {
    let h = crate::options::helper_args(args.into_iter().skip(1).collect())?;
    let policy = sheaf_trust::Policy::load(false, None, None)?;
    // mount(8) passes no flags: the remote settings are the flags' defaults
    // (and their environment variables), changed by options.
    let remote = RemoteArgs::from_env()?;
    mount(
        &Target {
            images: &[h.image],
            pins: &[],
            upper: None,
            mountpoint: &h.mountpoint,
        },
        &h.options,
        h.foreground,
        true,
        &policy,
        &remote,
    )
}
