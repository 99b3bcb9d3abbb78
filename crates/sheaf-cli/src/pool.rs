//! `sheaf pool ...` and `sheaf shell-init`: arguments and printing; the
//! layout rules and shell code are `sheaf_pool`'s, the copy `sheaf_bcast`'s,
//! and the mount a `sheaf mount` child process.

use crate::build::{write_image, ImageArgs};
use crate::util::{human, PolicyArgs, RemoteArgs};
use anyhow::{bail, Context, Result};
use sheaf_pool::{Config, Package};
use std::io::Write;
use std::path::{Path, PathBuf};

/// `sheaf pool` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum PoolCmd {
    /// Write a pool skeleton (one example package and its modulefile).
    Init {
        /// Directory to create.
        #[arg(value_hint = clap::ValueHint::DirPath)]
        dir: PathBuf,
    },
    /// Check a pool directory's layout and pack it into an image.
    Build(PoolBuildArgs),
    /// Bring a pool to this node (broadcast under mpirun/srun), mount it,
    /// and add its modulefiles to Lmod. Needs the shell function from
    /// `eval "$(sheaf shell-init bash)"`, or `eval "$(sheaf pool load X --sh)"`.
    Load(PoolLoadArgs),
    /// Unload a pool's modules, remove it from Lmod's path and unmount it.
    Unload {
        /// NAME/VERSION of a loaded pool.
        pool: String,
        /// Print shell code for the calling shell to evaluate.
        #[arg(long)]
        sh: bool,
    },
    /// Loaded pools and node-local copies.
    List {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Pools the configured locations offer (directories are scanned; a
    /// URL location is listed by its pools.json, see `pool publish`).
    Avail {
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Publish a pool image into a location directory (to be shared or
    /// served over HTTP): a repository NAME/ with index VERSION, whose
    /// objects later versions share (HTTP loads fetch only what changed),
    /// and the location's catalogue pools.json rewritten from its contents.
    #[command(
        after_help = "Examples:\n  sheaf pool publish pystack-2024.2.sheaf /srv/pools --name pystack/2024.2\n  sheaf pool publish /srv/pools    # only rewrite the catalogue\n  # with /srv/pools served at https://repo.example/pools, nodes set\n  # [pools] locations = [\"https://repo.example/pools\"] and run\n  sheaf pool avail; sheaf pool load pystack/2024.2"
    )]
    Publish {
        /// [IMAGE] LOCATION: the pool image (omit it to only rewrite the
        /// catalogue) and the location directory.
        #[arg(required = true, num_args = 1..=2, value_names = ["IMAGE", "LOCATION"])]
        paths: Vec<PathBuf>,
        /// NAME/VERSION (default: from IMAGE's path, .../NAME/VERSION.sheaf).
        #[arg(long)]
        name: Option<String>,
        /// Machine-readable output.
        #[arg(long)]
        json: bool,
    },
    /// Remove node-local copies that are not mounted, keeping the newest
    /// KEEP versions of each pool.
    Gc {
        /// Versions of each pool to keep.
        #[arg(long, default_value_t = 1)]
        keep: usize,
        /// Only say what would be removed.
        #[arg(long)]
        dry_run: bool,
        /// Print what was (or would be) removed as JSON (docs/json.md).
        #[arg(long)]
        json: bool,
    },
}

/// Arguments of `sheaf pool build`.
#[derive(clap::Args, Debug)]
pub struct PoolBuildArgs {
    /// The pool directory (install/, modulefiles/, optional source/, config/).
    #[arg(value_hint = clap::ValueHint::DirPath)]
    dir: PathBuf,
    /// The image to write (convention: LOCATION/NAME/VERSION.sheaf).
    #[arg(short, long)]
    output: PathBuf,
    /// NAME/VERSION of the pool.
    #[arg(long)]
    name: String,
    #[command(flatten)]
    image: ImageArgs,
}

/// Arguments of `sheaf pool load`.
#[derive(clap::Args, Debug)]
pub struct PoolLoadArgs {
    /// NAME/VERSION (searched in the site config's [pools] locations), an
    /// image file, or a URL.
    pool: String,
    /// Print shell code for the calling shell to evaluate (what the
    /// shell-init function does).
    #[arg(long)]
    sh: bool,
    /// Use MPI for the copy: auto (when started by mpirun/srun), always, never.
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    mpi: String,
    #[command(flatten)]
    policy: PolicyArgs,
}

fn config() -> Result<Config> {
    Ok(Config::load(&sheaf_trust::policy::site_config()?)?)
}

/// `sheaf pool ...`.
pub fn run(cmd: PoolCmd, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    match cmd {
        PoolCmd::Init { dir } => {
            sheaf_pool::init(&dir)?;
            eprintln!(
                "wrote a pool skeleton in {d} (package hello/1.0); next: \
                 sheaf pool build {d} -o hello-pool.sheaf --name mypool/1.0",
                d = dir.display()
            );
            Ok(0)
        }
        PoolCmd::Build(a) => build(a, io),
        PoolCmd::Load(a) => load(a, remote),
        PoolCmd::Unload { pool, sh } => unload(&pool, sh),
        PoolCmd::List { json } => list(json),
        PoolCmd::Avail { json } => avail(json, remote),
        PoolCmd::Publish { paths, name, json } => publish(paths, name, json, remote),
        PoolCmd::Gc {
            keep,
            dry_run,
            json,
        } => gc(keep, dry_run, json),
    }
}

fn build(a: PoolBuildArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    sheaf_pool::parse_name(&a.name)?;
    let layout = sheaf_pool::check(&a.dir)?;
    if !layout.unlisted.is_empty() && !a.image.json {
        let _ = writeln!(
            io.stderr,
            "note: install directories without a modulefile (fine for dependencies): {}",
            layout.unlisted.join(", ")
        );
    }
    let mut opts = a.image.options()?;
    opts.pack_boundaries = sheaf_pool::pack_boundaries(&a.dir)?;
    // `pool load FILE` mounts it by this name, wherever the file lies.
    opts.labels
        .insert(sheaf_format::build_info::LABEL_POOL.into(), a.name.clone());
    let input = sheaf_build::Input::Dir(a.dir.clone());
    let names: Vec<String> = layout
        .packages
        .iter()
        .map(|p: &Package| format!("{}/{}", p.name, p.version))
        .collect();
    if !a.image.json && !a.image.quiet {
        let _ = writeln!(io.stderr, "pool {}: {}", a.name, names.join(", "));
    }
    // A location's layout is NAME/VERSION.sheaf: its NAME/ is made here.
    if let Some(dir) = a.output.parent().filter(|d| !d.as_os_str().is_empty()) {
        // trusted-path: the directory of the -o the user named
        std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
    }
    write_image(
        &input,
        &a.output,
        &opts,
        &a.image,
        serde_json::json!({"pool": a.name, "packages": names}),
        io,
    )
}

/// Fetches a location's catalogue over HTTP with the flags' network
/// settings (not their mirrors: those name one image).
fn fetcher(remote: &RemoteArgs) -> Result<impl Fn(&str) -> Result<Option<Vec<u8>>, String>> {
    let mut opts = crate::util::http_options(remote)?;
    opts.mirrors.clear();
    Ok(move |url: &str| {
        sheaf_net::fetch_file(url, opts.clone()).map_err(|e| sheaf_format::one_line(&e))
    })
}

/// NAME, VERSION and source of what `pool load` was given.
fn resolve(arg: &str, cfg: &Config, remote: &RemoteArgs) -> Result<(String, String, String)> {
    let is_url = sheaf_net::is_url(arg);
    if !is_url && !Path::new(arg).exists() {
        if let Ok((n, v)) = sheaf_pool::parse_name(arg) {
            let src = cfg.find(&n, &v, &fetcher(remote)?)?;
            return Ok((n, v, src));
        }
        bail!("{arg}: no such pool file, and not a NAME/VERSION");
    }
    let img = crate::util::open_image(Path::new(arg), remote)?;
    name_of(&img, arg).map(|(n, v)| (n, v, arg.to_string()))
}

/// The name a pool image was built with (`pool build --name`, kept in its
/// build information), else one made from where the file lies.
fn name_of(img: &sheaf_read::Image, arg: &str) -> Result<(String, String)> {
    match recorded_name(img) {
        Some(n) => sheaf_pool::parse_name(&n)
            .with_context(|| format!("{arg}: the pool name recorded in the image")),
        None => name_from_path(arg),
    }
}

/// `pool build --name`'s NAME/VERSION, as recorded in the image.
fn recorded_name(img: &sheaf_read::Image) -> Option<String> {
    let mut info = img.build_info().ok()?;
    info.labels.remove(sheaf_format::build_info::LABEL_POOL)
}

/// NAME and VERSION from a file or URL named like
/// LOCATION/NAME/VERSION[.sheaf].
fn name_from_path(arg: &str) -> Result<(String, String)> {
    let p = Path::new(arg.trim_end_matches('/'));
    let version = p
        .file_name()
        .map(|f| f.to_string_lossy().trim_end_matches(".sheaf").to_string())
        .unwrap_or_default();
    let name = p
        .parent()
        .and_then(|d| d.file_name())
        .map(|f| f.to_string_lossy().into_owned())
        .unwrap_or_default();
    sheaf_pool::parse_name(&format!("{name}/{version}"))
        .with_context(|| format!("{arg}: pool files are named NAME/VERSION.sheaf"))
}

/// Whether a sheaf filesystem is mounted at `mp`.
fn sheaf_mounted(mp: &Path) -> bool {
    matches!(sheaf_mount::kernel::mount_at(mp), Ok(Some(m)) if m.is_sheaf())
}

fn load(a: PoolLoadArgs, remote: &RemoteArgs) -> Result<i32> {
    let cfg = config()?;
    let (name, version, src) = resolve(&a.pool, &cfg, remote)?;
    let local = cfg.local_copy(&name, &version);
    let mp = cfg.mount_point(&name, &version);
    let exe = crate::util::sheaf_exe().context("the sheaf executable")?;
    let mut policy_flags: Vec<String> = Vec::new();
    if a.policy.require_signature {
        policy_flags.push("--require-signature".into());
    }
    if let Some(s) = &a.policy.signers {
        policy_flags.extend(["--signers".into(), s.display().to_string()]);
    }
    if let Some(i) = &a.policy.identity {
        policy_flags.extend(["--identity".into(), i.clone()]);
    }
    // Under a launcher every rank takes part in the broadcast (a collective:
    // skipping it on nodes that have the pool mounted would leave the others
    // waiting); alone, a mounted pool needs no copy.
    // The directories are checked (a default one must be this user's
    // alone) and made here, with no link followed, before anything is
    // copied or mounted into them.
    cfg.local_dir(&name)?;
    let mounts = cfg.mounts_dir(&name)?;
    if crate::bcast::wants_mpi(&a.mpi) || !sheaf_mounted(&mp) || !local.is_file() {
        // The copy, in a child: MPI (when launched so) lives and ends there,
        // before this process forks the mount's server.
        let st = std::process::Command::new(&exe)
            .args(remote.to_args())
            .arg("bcast")
            .args(["--mpi", &a.mpi])
            .args(&policy_flags)
            .arg(&src)
            .arg(&local)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running sheaf bcast")?;
        if !st.success() {
            bail!(
                "pool {name}/{version}: could not bring {src} to {}",
                local.display()
            );
        }
    }
    // The image is opened here once, under the policy, and from then on it
    // is its root digest: the mount is pinned to it, and a mount found at
    // the mount point is used only if it is this user's and serves it.
    let root = {
        let policy = a.policy.load()?;
        let img = crate::util::open_image(&local, remote)?;
        crate::trust::enforce(&policy, &img, &local)?;
        // A file or URL is named by what it records, read when first
        // opened: the copy must say the same.
        let by_file = sheaf_net::is_url(&a.pool) || Path::new(&a.pool).exists();
        if let (true, Some(n)) = (by_file, recorded_name(&img)) {
            if n != format!("{name}/{version}") {
                bail!(
                    "{}: the copy is pool {n}, not {name}/{version} (the image changed while it was loaded); run sheaf pool load again",
                    local.display()
                );
            }
        }
        img.root_digest()
    };
    // Ranks sharing a node mount once: the first under the lock mounts, the
    // others find it mounted.
    // (A mount there, perhaps one this user may not enter, is checked
    // below, not walked into.)
    if !sheaf_mounted(&mp) {
        mounts.create_dir(&version, 0o755)?;
    }
    let lock = mounts.open_lock(format!("{version}.mount-lock"))?;
    sheaf_dir::flock(&lock, true, true)
        .with_context(|| mp.with_extension("mount-lock").display().to_string())?;
    if sheaf_mounted(&mp) {
        crate::mount::check_existing(&mp, &[root])
            .with_context(|| format!("pool {name}/{version}"))?;
    } else {
        let mut req = sheaf_mount::MountRequest::new(
            vec![sheaf_mount::RequestImage {
                source: local.to_string_lossy().into_owned(),
                root: Some(root),
            }],
            mp.clone(),
        );
        remote.put_routes(&mut req);
        let o = crate::util::output_with_input(
            std::process::Command::new(&exe)
                .args(remote.to_args_without_routes())
                .arg("mount")
                .args(&policy_flags)
                .args(["--request", "-"])
                .stdout(std::process::Stdio::null()),
            &req.encode(),
        )
        .context("running sheaf mount")?;
        if !o.status.success() {
            let e = String::from_utf8_lossy(&o.stderr);
            bail!(
                "pool {name}/{version}: mount at {} failed: {}",
                mp.display(),
                e.trim().trim_start_matches("sheaf: error: ")
            );
        }
    }
    drop(lock);
    if a.sh {
        print!("{}", sheaf_pool::load_shell(&mp));
    } else {
        eprintln!(
            "pool {name}/{version} is mounted at {mp}; for Lmod: module use {mp}/modulefiles \
             (or eval \"$(sheaf shell-init bash)\" once, and `sheaf pool load` does it)",
            mp = mp.display()
        );
    }
    Ok(0)
}

/// `pool unload` takes NAME/VERSION, the pool's image file (named by what
/// it records) or its mount point.
fn unload(pool: &str, sh: bool) -> Result<i32> {
    let cfg = config()?;
    let given = Path::new(pool);
    let mp = if given.is_dir() && sheaf_mounted(given) {
        given.to_path_buf()
    } else if given.is_file() {
        let img = sheaf_read::open_path(given)?;
        let (n, v) = name_of(&img, pool)?;
        cfg.mount_point(&n, &v)
    } else {
        let (n, v) = sheaf_pool::parse_name(pool)?;
        cfg.mount_point(&n, &v)
    };
    if !sheaf_mounted(&mp) {
        bail!(
            "pool {pool} is not loaded (nothing mounted at {})",
            mp.display()
        );
    }
    let exe = crate::util::sheaf_exe().context("the sheaf executable")?;
    if sh {
        print!(
            "{}",
            sheaf_pool::unload_shell(&mp, &exe.display().to_string())
        );
        return Ok(0);
    }
    let st = std::process::Command::new(&exe)
        .arg("umount")
        .arg(&mp)
        .status()?;
    eprintln!(
        "note: run `module unuse {}/modulefiles` in your shell (or use the shell-init function)",
        mp.display()
    );
    Ok(if st.success() { 0 } else { 1 })
}

/// Local copies: (NAME/VERSION, path, bytes, mtime).
fn local_copies(cfg: &Config) -> Vec<(String, PathBuf, u64, std::time::SystemTime)> {
    let offers = sheaf_pool::scan_location(&cfg.local).unwrap_or_default();
    offers
        .into_iter()
        .filter(|o| o.form == "image")
        .filter_map(|o| {
            let md = std::fs::metadata(&o.source).ok()?;
            let mtime = md.modified().unwrap_or(std::time::UNIX_EPOCH);
            Some((o.pool, PathBuf::from(o.source), md.len(), mtime))
        })
        .collect()
}

fn list(json: bool) -> Result<i32> {
    let cfg = config()?;
    /// A row of `pool list` (fields sorted, as printed before).
    #[derive(serde::Serialize)]
    struct Row {
        bytes: u64,
        copy: PathBuf,
        mounted: Option<String>,
        pool: String,
    }
    let rows: Vec<Row> = local_copies(&cfg)
        .into_iter()
        .map(|(pool, copy, bytes, _)| {
            let (n, v) = sheaf_pool::parse_name(&pool).unwrap_or_default();
            let mp = cfg.mount_point(&n, &v);
            let mounted = sheaf_mounted(&mp);
            Row {
                bytes,
                copy,
                mounted: mounted.then(|| mp.display().to_string()),
                pool,
            }
        })
        .collect();
    if json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(0);
    }
    if rows.is_empty() {
        eprintln!("no pools on this node ({})", cfg.local.display());
    }
    for r in rows {
        println!(
            "{:<28} {:>10}  {}",
            r.pool,
            human(r.bytes),
            r.mounted
                .as_deref()
                .map_or("not mounted".to_string(), |m| format!("mounted at {m}"))
        );
    }
    Ok(0)
}

fn avail(json: bool, remote: &RemoteArgs) -> Result<i32> {
    let cfg = config()?;
    let (v, bad) = cfg.avail(&fetcher(remote)?);
    for (loc, why) in &bad {
        eprintln!("warning: pool location {loc}: {why}");
    }
    if json {
        println!("{}", serde_json::to_string(&v)?);
    } else {
        if cfg.locations.is_empty() {
            eprintln!(
                "no pool locations configured ([pools] locations in {})",
                sheaf_trust::policy::config_path().display()
            );
        }
        for o in &v {
            println!("{:<28} {:<10} {}", o.pool, o.form, o.source);
        }
    }
    // Some listing beats none: fail only when every location failed.
    Ok(if !bad.is_empty() && bad.len() == cfg.locations.len() {
        1
    } else {
        0
    })
}

fn publish(
    mut paths: Vec<PathBuf>,
    name: Option<String>,
    json: bool,
    remote: &RemoteArgs,
) -> Result<i32> {
    let location = paths
        .pop()
        .context("pool publish: name the location directory")?;
    let image = paths.pop();
    /// What `pool publish --json` prints (fields sorted, as before).
    #[derive(serde::Serialize)]
    struct Published {
        #[serde(skip_serializing_if = "Option::is_none")]
        bytes_written: Option<u64>,
        catalogue: serde_json::Value,
        location: String,
        #[serde(skip_serializing_if = "Option::is_none")]
        objects_reused: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        objects_written: Option<u64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        pool: Option<String>,
    }
    let mut out = Published {
        bytes_written: None,
        catalogue: serde_json::Value::Null,
        location: location.display().to_string(),
        objects_reused: None,
        objects_written: None,
        pool: None,
    };
    if let Some(image) = image {
        let (n, v) = match &name {
            Some(x) => sheaf_pool::parse_name(x)?,
            None => {
                name_from_path(&image.display().to_string()).context("give --name NAME/VERSION")?
            }
        };
        let img = crate::util::open_image(&image, remote)?;
        let r = sheaf_net::publish(&img, &location.join(&n), &v, &|_, _| {})?;
        if !json {
            eprintln!(
                "published {n}/{v} into {}: {} new objects ({}), {} already there",
                location.join(&n).display(),
                r.written,
                human(r.written_bytes),
                r.reused
            );
        }
        out.pool = Some(format!("{n}/{v}"));
        out.objects_written = Some(r.written);
        out.bytes_written = Some(r.written_bytes);
        out.objects_reused = Some(r.reused);
    } else if name.is_some() {
        bail!("pool publish: --name needs an image");
    }
    let offers = sheaf_pool::write_catalogue(&location)?;
    if json {
        // Through a Value: the offers' fields print sorted, as before.
        out.catalogue = serde_json::to_value(&offers)?;
        println!("{}", serde_json::to_string(&out)?);
    } else {
        eprintln!(
            "{}: {} pools listed",
            location.join(sheaf_pool::CATALOGUE).display(),
            offers.len()
        );
    }
    Ok(0)
}

/// What `pool gc --json` prints (docs/json.md; fields sorted, as printed
/// before).
#[derive(serde::Serialize)]
struct GcReport {
    dry_run: bool,
    freed_bytes: u64,
    removed: Vec<GcRemoved>,
}

/// A copy `pool gc` removed (or would remove).
#[derive(serde::Serialize)]
struct GcRemoved {
    bytes: u64,
    path: String,
    pool: String,
}

fn gc(keep: usize, dry_run: bool, json: bool) -> Result<i32> {
    let cfg = config()?;
    let mut copies = local_copies(&cfg);
    // Newest first within each pool name.
    copies.sort_by(|a, b| {
        let (na, nb) = (a.0.split('/').next(), b.0.split('/').next());
        na.cmp(&nb).then(b.3.cmp(&a.3))
    });
    let mut kept: std::collections::HashMap<String, usize> = Default::default();
    let mut freed = 0u64;
    let mut removed = Vec::new();
    for (pool, path, bytes, _) in copies {
        let (n, v) = sheaf_pool::parse_name(&pool).unwrap_or_default();
        let k = kept.entry(n.clone()).or_default();
        if sheaf_mounted(&cfg.mount_point(&n, &v)) || *k < keep {
            *k += 1;
            continue;
        }
        if !dry_run {
            std::fs::remove_file(&path).with_context(|| path.display().to_string())?;
            let _ = std::fs::remove_file(sheaf_trust::policy::detached_path(&path));
        }
        if json {
            removed.push(GcRemoved {
                bytes,
                path: path.display().to_string(),
                pool,
            });
        } else if dry_run {
            println!("would remove {}", path.display());
        } else {
            println!("removed {}", path.display());
        }
        freed += bytes;
    }
    if json {
        let report = GcReport {
            dry_run,
            freed_bytes: freed,
            removed,
        };
        println!("{}", serde_json::to_string(&report)?);
        return Ok(0);
    }
    eprintln!(
        "{} {}",
        if dry_run { "would free" } else { "freed" },
        human(freed)
    );
    Ok(0)
}

/// `sheaf shell-init SHELL`.
pub fn shell_init(shell: &str, io: &mut crate::Io<'_>) -> Result<i32> {
    let exe = crate::util::sheaf_exe().context("the sheaf executable")?;
    match shell {
        "bash" | "zsh" | "sh" => write!(
            io.stdout,
            "{}",
            sheaf_pool::shell_init(&exe.display().to_string())
        )?,
        other => bail!("shell-init: {other}: supported shells are bash and zsh"),
    }
    Ok(0)
}
