//! Software pools: a whole software stack in one image, brought to each node
//! and handed to Lmod.
//!
//! Owns the pool layout and its checks ([`check`]), the skeleton
//! ([`init`]), where pools are found and kept ([`Config`]: site config
//! `[pools]`), and the shell code that tells Lmod about a mounted pool
//! ([`load_shell`], [`unload_shell`]). Moving the image is `sheaf_bcast`'s;
//! mounting is the CLI's (it spawns `sheaf mount`). Layout (docs/pools.md):
//!
//! ```text
//! install/PKG/VER/...        the installed software
//! modulefiles/PKG/VER.lua    one Lmod modulefile per install directory
//! source/, config/           optional: what is needed to rebuild it
//! ```

use std::fs;
use std::path::{Path, PathBuf};

/// Why a pool could not be built, found or loaded.
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    /// The directory does not have the pool layout.
    #[error("{dir}: not a pool: {why}")]
    Layout {
        /// The pool directory.
        dir: String,
        /// What is wrong.
        why: String,
    },
    /// A modulefile breaks a rule.
    #[error("{file}: {why}")]
    Modulefile {
        /// The modulefile.
        file: String,
        /// What is wrong.
        why: String,
    },
    /// A name that is not NAME/VERSION.
    #[error("{0:?}: a pool is named NAME/VERSION (e.g. pystack/2024.1)")]
    BadName(String),
    /// No configured location holds the pool.
    #[error("pool {name} not found in {where_}")]
    NotFound {
        /// NAME/VERSION.
        name: String,
        /// The locations searched.
        where_: String,
    },
    /// The site configuration is malformed.
    #[error("{path}: {why}")]
    Config {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// sheaf's default pool directory cannot be trusted (see
    /// [`Config::defaults`]).
    #[error("{0}; or set [pools] local and mounts in the site config")]
    Private(#[from] sheaf_dir::PrivateDirError),
    /// A file could not be read or written.
    #[error("{path}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// `ROOT/NAME`, made and opened with no link followed below `ROOT`; a
/// default `ROOT` is checked as private first.
fn dir_of(root: &Path, private: bool, name: &str) -> Result<sheaf_dir::Dir, PoolError> {
    let root_dir = if private {
        sheaf_dir::private_dir(root)?
    } else {
        sheaf_dir::Dir::create_all(root, 0o755).map_err(io(root))?
    };
    root_dir.create_dir(name, 0o755).map_err(io(root))
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> PoolError + '_ {
    move |source| PoolError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// The top-level directories a pool may hold.
pub const TOP: [&str; 4] = ["install", "modulefiles", "source", "config"];

/// One package version of a pool.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Package {
    /// Package name.
    pub name: String,
    /// Version.
    pub version: String,
}

/// What [`check`] found.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Layout {
    /// Every package version with a modulefile and an install directory.
    pub packages: Vec<Package>,
    /// Install directories without a modulefile (allowed: dependencies
    /// loaded by other modulefiles), as `PKG/VER`.
    pub unlisted: Vec<String>,
}

fn sorted_dirs(p: &Path) -> Result<Vec<(String, PathBuf)>, PoolError> {
    let mut v = Vec::new();
    for e in fs::read_dir(p).map_err(io(p))? {
        let e = e.map_err(io(p))?;
        v.push((e.file_name().to_string_lossy().into_owned(), e.path()));
    }
    v.sort();
    Ok(v)
}

/// Check `dir` has the pool layout: `install/` and `modulefiles/` and
/// nothing else at the top but `source/` and `config/`; every
/// `modulefiles/PKG/VER.lua` has `install/PKG/VER/`; every modulefile is
/// relocatable: it finds the pool root from its own path (Lmod's
/// `myFileName()`), and never names the directory it was built in.
pub fn check(dir: &Path) -> Result<Layout, PoolError> {
    let layout = |why: String| PoolError::Layout {
        dir: dir.display().to_string(),
        why,
    };
    let abs = fs::canonicalize(dir).map_err(io(dir))?;
    for (name, p) in sorted_dirs(dir)? {
        if !TOP.contains(&name.as_str()) {
            return Err(layout(format!(
                "unexpected top-level entry {name:?} (a pool holds only {})",
                TOP.join(", ")
            )));
        }
        if !p.is_dir() {
            return Err(layout(format!("{name} is not a directory")));
        }
    }
    for need in ["install", "modulefiles"] {
        if !dir.join(need).is_dir() {
            return Err(layout(format!("no {need}/ directory")));
        }
    }
    let mut packages = Vec::new();
    for (pkg, pdir) in sorted_dirs(&dir.join("modulefiles"))? {
        if !pdir.is_dir() {
            return Err(layout(format!(
                "modulefiles/{pkg}: expected a directory modulefiles/PKG/ holding VER.lua files"
            )));
        }
        for (file, fpath) in sorted_dirs(&pdir)? {
            if file.starts_with('.') {
                continue; // .modulerc.lua, .version: Lmod's own
            }
            let Some(ver) = file.strip_suffix(".lua") else {
                return Err(PoolError::Modulefile {
                    file: fpath.display().to_string(),
                    why: "modulefiles are Lua (PKG/VER.lua)".into(),
                });
            };
            let text = fs::read_to_string(&fpath).map_err(io(&fpath))?;
            let bad = |why: String| PoolError::Modulefile {
                file: fpath.display().to_string(),
                why,
            };
            if !dir.join("install").join(&pkg).join(ver).is_dir() {
                return Err(bad(format!("no install/{pkg}/{ver}/ for this modulefile")));
            }
            let abs_s = abs.to_string_lossy();
            let given = dir.to_string_lossy();
            if text.contains(&*abs_s) || (given.starts_with('/') && text.contains(&*given)) {
                return Err(bad(format!(
                    "names the build directory {abs_s}: it must find the pool root from its own \
                     path (myFileName()), since the pool is mounted elsewhere"
                )));
            }
            if !text.contains("myFileName") {
                return Err(bad(
                    "not relocatable: find the pool root from the modulefile's own path, e.g. \
                     local root = myFileName():match(\"(.*)/modulefiles/\") (see sheaf pool init)"
                        .into(),
                ));
            }
            packages.push(Package {
                name: pkg.clone(),
                version: ver.to_string(),
            });
        }
    }
    let mut unlisted = Vec::new();
    for (pkg, pdir) in sorted_dirs(&dir.join("install"))? {
        if !pdir.is_dir() {
            return Err(layout(format!("install/{pkg} is not a directory")));
        }
        for (ver, _) in sorted_dirs(&pdir)? {
            if !packages.iter().any(|p| p.name == pkg && p.version == ver) {
                unlisted.push(format!("{pkg}/{ver}"));
            }
        }
    }
    if packages.is_empty() {
        return Err(layout("no modulefiles/PKG/VER.lua".into()));
    }
    Ok(Layout { packages, unlisted })
}

/// The directories whose files are packed apart from the rest
/// (`sheaf_build::BuildOptions::pack_boundaries`): each package version's
/// install directory and each package's modulefiles, source and config, so
/// a package that did not change keeps identical blocks in the next pool
/// version and a node holding the old version receives only the new parts.
pub fn pack_boundaries(dir: &Path) -> Result<Vec<Vec<u8>>, PoolError> {
    let mut v = Vec::new();
    for (pkg, p) in sorted_dirs(&dir.join("install"))? {
        if p.is_dir() {
            for (ver, _) in sorted_dirs(&p)? {
                v.push(format!("install/{pkg}/{ver}").into_bytes());
            }
        }
    }
    for top in ["modulefiles", "source", "config"] {
        if dir.join(top).is_dir() {
            for (name, _) in sorted_dirs(&dir.join(top))? {
                v.push(format!("{top}/{name}").into_bytes());
            }
        }
    }
    Ok(v)
}

/// The modulefile of the example package `sheaf pool init` writes: it
/// finds the pool root from its own path, so it works wherever the pool is
/// mounted.
pub const EXAMPLE_MODULEFILE: &str = r#"-- hello/1.0: an example package of a sheaf pool.
-- The pool root is found from this file's own path (the pool is mounted at
-- a different place on every machine); never write absolute paths here.
local root = myFileName():match("(.*)/modulefiles/")
local prefix = pathJoin(root, "install", myModuleName(), myModuleVersion())

whatis("Name: hello")
whatis("Version: 1.0")
help([[An example package: prints a greeting.]])

prepend_path("PATH", pathJoin(prefix, "bin"))
"#;

/// Write a pool skeleton with one example package into `dir` (which must
/// be empty or missing).
pub fn init(dir: &Path) -> Result<(), PoolError> {
    if dir.exists() && fs::read_dir(dir).map_err(io(dir))?.next().is_some() {
        return Err(PoolError::Layout {
            dir: dir.display().to_string(),
            why: "not empty; sheaf pool init writes a new pool".into(),
        });
    }
    // The skeleton is written with no link followed below `dir` (one
    // planted in a new pool directory would otherwise be written through).
    let root = sheaf_dir::Dir::create_all(dir, 0o755).map_err(io(dir))?;
    let mk = |rel: &str| {
        root.create_dir_all(Path::new(rel), 0o755)
            .map_err(io(&dir.join(rel)))
    };
    let bin = mk("install/hello/1.0/bin")?;
    let mf = mk("modulefiles/hello")?;
    let source = mk("source")?;
    mk("config")?;
    let put = |d: &sheaf_dir::Dir, name: &str, text: &str, mode: u32| {
        let shown = d.path().join(name);
        let mut f = d.create_new(name, mode).map_err(io(&shown))?;
        std::io::Write::write_all(&mut f, text.as_bytes()).map_err(io(&shown))?;
        sheaf_dir::set_mode(&f, mode).map_err(io(&shown))
    };
    put(
        &bin,
        "hello",
        "#!/bin/sh\necho \"hello from a sheaf pool\"\n",
        0o755,
    )?;
    put(&mf, "1.0.lua", EXAMPLE_MODULEFILE, 0o644)?;
    put(
        &source,
        "README",
        "Put here what rebuilding the pool needs (recipes, spack.yaml, environment.yml).\n",
        0o644,
    )?;
    Ok(())
}

/// Split `NAME/VERSION`.
pub fn parse_name(s: &str) -> Result<(String, String), PoolError> {
    let ok = |p: &str| {
        !p.is_empty()
            && p != "."
            && p != ".."
            && p.chars()
                .all(|c| c.is_ascii_alphanumeric() || "._+-".contains(c))
    };
    match s.split_once('/') {
        Some((n, v)) if ok(n) && ok(v) => Ok((n.to_string(), v.to_string())),
        _ => Err(PoolError::BadName(s.to_string())),
    }
}

/// Where pools are found and kept (site config `[pools]`, e.g.
/// `/etc/sheaf/config.toml`):
///
/// ```toml
/// [pools]
/// locations = ["/shared/pools", "https://repo.example/pools"]
/// local = "/local/scratch/sheaf-pools"   # node-local copies
/// mounts = "/local/scratch/sheaf-mnt"     # where pools are mounted
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// Shared directories and URLs holding `NAME/VERSION.sheaf`.
    pub locations: Vec<String>,
    /// Node-local directory of pool copies.
    pub local: PathBuf,
    /// Directory under which pools are mounted (`MOUNTS/NAME/VERSION`).
    pub mounts: PathBuf,
    /// Whether `local` is sheaf's default (a private directory: see
    /// [`Config::local_dir`]) rather than the site's choice.
    pub local_is_default: bool,
    /// Whether `mounts` is sheaf's default.
    pub mounts_is_default: bool,
}

impl Config {
    /// Defaults: no locations; copies under `$TMPDIR/sheaf-pools-UID/images`
    /// (node-local on every cluster), mounts under
    /// `$XDG_RUNTIME_DIR/sheaf-pools` where the session has one (made by
    /// the system, this user's alone) and `$TMPDIR/sheaf-pools-UID/mnt`
    /// elsewhere. A predictable name in a shared directory can be made
    /// first by someone else: these directories are made mode 0700 and
    /// checked every time they are used ([`sheaf_dir::private_dir`]).
    pub fn defaults() -> Config {
        // SAFETY: getuid has no preconditions.
        let uid = unsafe { libc::getuid() };
        let base = std::env::var_os("TMPDIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute())
            .unwrap_or_else(|| PathBuf::from("/tmp"))
            .join(format!("sheaf-pools-{uid}"));
        let mounts = std::env::var_os("XDG_RUNTIME_DIR")
            .map(PathBuf::from)
            .filter(|p| p.is_absolute() && p.is_dir())
            .map(|p| p.join("sheaf-pools"))
            .unwrap_or_else(|| base.join("mnt"));
        Config {
            locations: Vec::new(),
            local: base.join("images"),
            mounts,
            local_is_default: true,
            mounts_is_default: true,
        }
    }

    /// The directory of NAME's copies (`LOCAL/NAME`), made if missing and
    /// opened with no link followed below `LOCAL`; sheaf's default `LOCAL`
    /// is checked as private first (and refused, saying why, when another
    /// user could have planted or can change it).
    pub fn local_dir(&self, name: &str) -> Result<sheaf_dir::Dir, PoolError> {
        dir_of(&self.local, self.local_is_default, name)
    }

    /// The directory of NAME's mount points (`MOUNTS/NAME`), as
    /// [`Config::local_dir`].
    pub fn mounts_dir(&self, name: &str) -> Result<sheaf_dir::Dir, PoolError> {
        dir_of(&self.mounts, self.mounts_is_default, name)
    }

    /// The defaults overridden by the `[pools]` table of the file at
    /// `path` (missing file: defaults).
    pub fn load(path: &Path) -> Result<Config, PoolError> {
        let mut c = Config::defaults();
        let text = match fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(c),
            Err(e) => return Err(io(path)(e)),
        };
        let bad = |why: String| PoolError::Config {
            path: path.display().to_string(),
            why,
        };
        let v: toml::Table = text.parse().map_err(|e: toml::de::Error| {
            bad(e.to_string().lines().next().unwrap_or("").to_string())
        })?;
        /// The site config's tables sheaf-pool reads.
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Site {
            pools: Option<toml::Value>,
        }
        /// `[pools]`, each value as found (its type is checked here, so a
        /// mistake is named).
        #[derive(serde::Deserialize, Default)]
        #[serde(default)]
        struct Pools {
            locations: Option<toml::Value>,
            local: Option<toml::Value>,
            mounts: Option<toml::Value>,
        }
        let site: Site = toml::Value::Table(v).try_into().unwrap_or_default();
        let Some(t) = site.pools else {
            return Ok(c);
        };
        if !t.is_table() {
            return Err(bad("[pools] is not a table".into()));
        }
        let t: Pools = t.try_into().unwrap_or_default();
        if let Some(l) = &t.locations {
            let a = l
                .as_array()
                .ok_or_else(|| bad("pools.locations: a list of directories and URLs".into()))?;
            c.locations = a
                .iter()
                .map(|x| {
                    x.as_str()
                        .map(String::from)
                        .ok_or_else(|| bad("pools.locations: strings only".into()))
                })
                .collect::<Result<_, _>>()?;
        }
        for (key, slot, x) in [
            ("local", &mut c.local, &t.local),
            ("mounts", &mut c.mounts, &t.mounts),
        ] {
            if let Some(x) = x {
                *slot = PathBuf::from(
                    x.as_str()
                        .ok_or_else(|| bad(format!("pools.{key}: a path")))?,
                );
                if key == "local" {
                    c.local_is_default = false;
                } else {
                    c.mounts_is_default = false;
                }
            }
        }
        Ok(c)
    }

    /// Where NAME/VERSION is found: the first location offering it (see
    /// [`Offer`]). A URL location is known by its catalogue, fetched with
    /// `fetch` (given the catalogue's URL); one without a catalogue is
    /// taken at its word: `LOC/NAME/VERSION`, a published repository or
    /// image.
    pub fn find(&self, name: &str, version: &str, fetch: &Fetch) -> Result<String, PoolError> {
        let want = format!("{name}/{version}");
        let mut problems = Vec::new();
        for loc in &self.locations {
            match offers(loc, fetch) {
                Ok(v) => {
                    if let Some(o) = v.into_iter().find(|o| o.pool == want) {
                        return Ok(o.source);
                    }
                }
                Err(LocationError::NoCatalogue) => {
                    return Ok(format!("{}/{want}", loc.trim_end_matches('/')));
                }
                Err(LocationError::Unreadable(e)) => problems.push(format!("{loc}: {e}")),
            }
        }
        Err(PoolError::NotFound {
            name: want,
            where_: if self.locations.is_empty() {
                "no locations (set [pools] locations in the site config, or name a file or URL)"
                    .into()
            } else if problems.is_empty() {
                self.locations.join(", ")
            } else {
                format!("{} ({})", self.locations.join(", "), problems.join("; "))
            },
        })
    }

    /// What the locations offer, in location order; with the locations
    /// that could not be listed and why.
    pub fn avail(&self, fetch: &Fetch) -> (Vec<Offer>, Vec<(String, String)>) {
        let mut v = Vec::new();
        let mut bad = Vec::new();
        for loc in &self.locations {
            match offers(loc, fetch) {
                Ok(o) => v.extend(o),
                Err(LocationError::NoCatalogue) => bad.push((
                    loc.clone(),
                    format!("no {CATALOGUE} (write one with `sheaf pool publish`)"),
                )),
                Err(LocationError::Unreadable(e)) => bad.push((loc.clone(), e)),
            }
        }
        (v, bad)
    }

    /// The node-local copy of NAME/VERSION.
    pub fn local_copy(&self, name: &str, version: &str) -> PathBuf {
        self.local.join(name).join(format!("{version}.sheaf"))
    }

    /// The mount point of NAME/VERSION.
    pub fn mount_point(&self, name: &str, version: &str) -> PathBuf {
        self.mounts.join(name).join(version)
    }
}

/// Fetches a whole small file by URL (the CLI's HTTP client): `Ok(None)`
/// when the server has no such file.
pub type Fetch = dyn Fn(&str) -> Result<Option<Vec<u8>>, String>;

/// The file listing what a pool location offers, so a location served over
/// HTTP can be listed: `LOCATION/pools.json`, written by
/// `sheaf pool publish` from the directory's contents.
pub const CATALOGUE: &str = "pools.json";

/// One pool a location offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Offer {
    /// NAME/VERSION.
    pub pool: String,
    /// `image` (`NAME/VERSION.sheaf`) or `repository` (published:
    /// `NAME/VERSION` is an image index beside `NAME/objects/`).
    pub form: String,
    /// Where to load it from: a path or URL (absolute; in a catalogue
    /// file, relative to the location).
    pub source: String,
}

#[derive(serde::Serialize, serde::Deserialize)]
struct CatalogueFile {
    /// Format version of the catalogue (1).
    sheaf_pools: u32,
    pools: Vec<Offer>,
}

enum LocationError {
    NoCatalogue,
    Unreadable(String),
}

fn is_url(loc: &str) -> bool {
    loc.starts_with("http://") || loc.starts_with("https://") || loc.starts_with("s3://")
}

/// What one location offers: a directory is scanned, a URL's catalogue read.
fn offers(loc: &str, fetch: &Fetch) -> Result<Vec<Offer>, LocationError> {
    if !is_url(loc) {
        return scan_location(Path::new(loc)).map_err(|e| LocationError::Unreadable(e.to_string()));
    }
    let base = loc.trim_end_matches('/');
    let url = format!("{base}/{CATALOGUE}");
    let bytes = fetch(&url)
        .map_err(LocationError::Unreadable)?
        .ok_or(LocationError::NoCatalogue)?;
    let mut v =
        parse_catalogue(&bytes).map_err(|e| LocationError::Unreadable(format!("{url}: {e}")))?;
    for o in &mut v {
        o.source = format!("{base}/{}", o.source);
    }
    Ok(v)
}

/// The offers of a catalogue file, sources relative to its location. Names
/// and sources are checked: a catalogue is untrusted input and must not
/// point outside its location.
pub fn parse_catalogue(bytes: &[u8]) -> Result<Vec<Offer>, String> {
    let c: CatalogueFile =
        serde_json::from_slice(bytes).map_err(|e| format!("not a pool catalogue: {e}"))?;
    if c.sheaf_pools != 1 {
        return Err(format!(
            "catalogue format {} (this sheaf reads 1)",
            c.sheaf_pools
        ));
    }
    for o in &c.pools {
        parse_name(&o.pool).map_err(|e| e.to_string())?;
        let safe = !o.source.is_empty()
            && !o.source.starts_with('/')
            && o.source
                .split('/')
                .all(|c| !c.is_empty() && c != "." && c != "..");
        if !safe {
            return Err(format!(
                "{}: source {:?} leaves the location",
                o.pool, o.source
            ));
        }
    }
    Ok(c.pools)
}

/// What the directory location `dir` offers: `NAME/VERSION.sheaf` image
/// files and published repositories (`NAME/VERSION` image indexes beside
/// `NAME/objects/`), sorted; sources are absolute paths.
pub fn scan_location(dir: &Path) -> Result<Vec<Offer>, PoolError> {
    let mut v = Vec::new();
    for (name, p) in sorted_dirs(dir)? {
        if name.starts_with('.') || !p.is_dir() {
            continue;
        }
        let repo = p.join("objects").is_dir();
        let Ok(files) = sorted_dirs(&p) else { continue };
        for (f, fp) in files {
            if f.starts_with('.') || f == "objects" || !fp.is_file() {
                continue;
            }
            let (version, form) = match f.strip_suffix(".sheaf") {
                Some(ver) => (ver.to_string(), "image"),
                None if repo && is_index(&fp) => (f.clone(), "repository"),
                None => continue,
            };
            if parse_name(&format!("{name}/{version}")).is_ok() {
                v.push(Offer {
                    pool: format!("{name}/{version}"),
                    form: form.into(),
                    source: fp.display().to_string(),
                });
            }
        }
    }
    Ok(v)
}

/// Whether `p` starts like an image index (format.md, remote images).
fn is_index(p: &Path) -> bool {
    use std::io::Read;
    let mut magic = [0u8; 8];
    fs::File::open(p)
        .and_then(|mut f| f.read_exact(&mut magic))
        .is_ok()
        && sheaf_format::remote::ImageIndex::is_index(&magic)
}

/// Write `dir`'s catalogue from what it holds ([`scan_location`]),
/// atomically; returns the offers.
pub fn write_catalogue(dir: &Path) -> Result<Vec<Offer>, PoolError> {
    let mut v = scan_location(dir)?;
    let prefix = format!("{}/", dir.display().to_string().trim_end_matches('/'));
    for o in &mut v {
        o.source = o
            .source
            .strip_prefix(&prefix)
            .unwrap_or(&o.source)
            .to_string();
    }
    let body = serde_json::to_vec_pretty(&CatalogueFile {
        sheaf_pools: 1,
        pools: v.clone(),
    })
    .expect("serializable");
    let dest = dir.join(CATALOGUE);
    // Readers fetch it at any moment; the location may be shared with
    // other users (no predictable temporary name to plant a link at).
    sheaf_net::publish::write_file_atomic(dir, &dest, &body).map_err(io(&dest))?;
    Ok(v)
}

/// Quote for POSIX shells (bash, zsh).
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Shell code (bash, zsh) that adds a mounted pool's modulefiles through
/// Lmod (`module use`, so Lmod keeps its module table and reference counts
/// right). It fails, changing nothing, when `module` is not defined.
pub fn load_shell(mount: &Path) -> String {
    let mf = sh_quote(&mount.join("modulefiles").display().to_string());
    format!(
        "if ! command -v module >/dev/null 2>&1; then \
         echo 'sheaf: the module command (Lmod) is not defined in this shell; source Lmod'\\''s init script first' >&2; false; \
         else module use {mf}; fi\n"
    )
}

/// Shell code that unloads the modules loaded from a pool (Lmod's
/// `$_LMFILES_` names their files), removes its modulefiles from Lmod's
/// path, and then unmounts it with `sheaf umount`.
pub fn unload_shell(mount: &Path, sheaf: &str) -> String {
    let m = mount.display().to_string();
    let mf = sh_quote(&format!("{m}/modulefiles"));
    let prefix = sh_quote(&format!("{m}/"));
    format!(
        "if command -v module >/dev/null 2>&1; then \
         __sheaf_files=\"${{_LMFILES_:-}}\"; __sheaf_mods=\"${{LOADEDMODULES:-}}\"; \
         while [ -n \"$__sheaf_files\" ]; do \
         __sheaf_f=\"${{__sheaf_files%%:*}}\"; __sheaf_m=\"${{__sheaf_mods%%:*}}\"; \
         case \"$__sheaf_f\" in {prefix}*) module unload \"$__sheaf_m\";; esac; \
         [ \"$__sheaf_files\" = \"$__sheaf_f\" ] && break; \
         __sheaf_files=\"${{__sheaf_files#*:}}\"; __sheaf_mods=\"${{__sheaf_mods#*:}}\"; \
         done; module unuse {mf}; \
         unset __sheaf_files __sheaf_mods __sheaf_f __sheaf_m; fi; \
         {} umount {}\n",
        sh_quote(sheaf),
        sh_quote(&m)
    )
}

/// `eval "$(sheaf shell-init bash)"`: a `sheaf` shell function that runs
/// `pool load`/`pool unload` with `--sh` and evaluates what they print (a
/// program cannot change its caller's environment), and passes every other
/// command through. Bash and zsh share it.
pub fn shell_init(sheaf: &str) -> String {
    let exe = sh_quote(sheaf);
    format!(
        "sheaf() {{\n  \
           if [ \"$1\" = pool ] && {{ [ \"$2\" = load ] || [ \"$2\" = unload ]; }}; then\n    \
             local __sheaf_code\n    \
             __sheaf_code=\"$({exe} \"$@\" --sh)\" || return $?\n    \
             eval \"$__sheaf_code\"\n  \
           else\n    \
             {exe} \"$@\"\n  \
           fi\n\
         }}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_is_written_without_following_a_planted_link() {
        let t = tempfile::tempdir().unwrap();
        let victim = t.path().join("victim");
        fs::write(&victim, b"precious").unwrap();
        let loc = t.path().join("loc");
        fs::create_dir(&loc).unwrap();
        // The name this process used to write through.
        let planted = loc.join(format!(".{CATALOGUE}.{}", std::process::id()));
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        write_catalogue(&loc).unwrap();
        assert_eq!(fs::read(&victim).unwrap(), b"precious");
        let cat = loc.join(CATALOGUE);
        assert!(fs::symlink_metadata(&cat).unwrap().file_type().is_file());
        assert!(parse_catalogue(&fs::read(&cat).unwrap())
            .unwrap()
            .is_empty());
    }

    #[test]
    fn the_skeleton_passes_the_checks_and_broken_pools_do_not() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("pool");
        init(&d).unwrap();
        let l = check(&d).unwrap();
        assert_eq!(
            l.packages,
            vec![Package {
                name: "hello".into(),
                version: "1.0".into()
            }]
        );
        assert!(init(&d).is_err(), "init refuses a non-empty directory");
        // A modulefile with the build directory's absolute path.
        let abs = fs::canonicalize(&d).unwrap();
        let m = d.join("modulefiles/hello/1.0.lua");
        fs::write(
            &m,
            format!(
                "prepend_path(\"PATH\", \"{}/install/hello/1.0/bin\") -- myFileName",
                abs.display()
            ),
        )
        .unwrap();
        let e = check(&d).unwrap_err().to_string();
        assert!(e.contains("build directory"), "{e}");
        // Not finding its root at all.
        fs::write(&m, "prepend_path(\"PATH\", \"/opt/hello/bin\")").unwrap();
        assert!(check(&d).unwrap_err().to_string().contains("relocatable"));
        // A modulefile without an install directory.
        fs::write(&m, EXAMPLE_MODULEFILE).unwrap();
        fs::write(d.join("modulefiles/hello/2.0.lua"), EXAMPLE_MODULEFILE).unwrap();
        assert!(check(&d)
            .unwrap_err()
            .to_string()
            .contains("install/hello/2.0"));
        fs::remove_file(d.join("modulefiles/hello/2.0.lua")).unwrap();
        // A stray top-level entry.
        fs::write(d.join("notes.txt"), "x").unwrap();
        assert!(check(&d).unwrap_err().to_string().contains("notes.txt"));
    }

    #[test]
    fn names_and_config() {
        assert_eq!(
            parse_name("py/2024.1").unwrap(),
            ("py".to_string(), "2024.1".to_string())
        );
        for bad in ["py", "py/", "/1", "a/../b", "a/b/c", "../x", "a b/1"] {
            assert!(parse_name(bad).is_err(), "{bad}");
        }
        let t = tempfile::tempdir().unwrap();
        let f = t.path().join("config.toml");
        fs::write(
            &f,
            "[signatures]\nrequire = false\n[pools]\nlocations = [\"/s/pools\", \"https://h/p\"]\nlocal = \"/l\"\n",
        )
        .unwrap();
        let c = Config::load(&f).unwrap();
        assert_eq!(c.locations, vec!["/s/pools", "https://h/p"]);
        assert_eq!(c.local, PathBuf::from("/l"));
        // /s/pools does not exist (skipped); the URL has no catalogue, so
        // NAME/VERSION is taken at its word there.
        let none: &Fetch = &|_| Ok(None);
        assert_eq!(c.find("a", "1", none).unwrap(), "https://h/p/a/1");
        fs::write(&f, "[pools]\nlocations = \"/x\"\n").unwrap();
        assert!(Config::load(&f).is_err());
    }

    #[test]
    fn catalogues_are_checked_and_decide_where_a_pool_is_found() {
        let cat = |pools: &str| format!("{{\"sheaf_pools\": 1, \"pools\": [{pools}]}}");
        let ok = cat(r#"{"pool": "a/1", "form": "image", "source": "a/1.sheaf"}"#);
        assert_eq!(parse_catalogue(ok.as_bytes()).unwrap().len(), 1);
        for bad in [
            cat(r#"{"pool": "a/1", "form": "image", "source": "../x.sheaf"}"#),
            cat(r#"{"pool": "a/1", "form": "image", "source": "/etc/passwd"}"#),
            cat(r#"{"pool": "a/1", "form": "image", "source": "a//1"}"#),
            cat(r#"{"pool": "a/../1", "form": "image", "source": "a/1"}"#),
            r#"{"sheaf_pools": 2, "pools": []}"#.to_string(),
            "not json".to_string(),
        ] {
            assert!(parse_catalogue(bad.as_bytes()).is_err(), "{bad}");
        }
        let c = Config {
            locations: vec!["https://one/p".into(), "https://two/p".into()],
            local: "/l".into(),
            mounts: "/m".into(),
            local_is_default: false,
            mounts_is_default: false,
        };
        // The first location's catalogue lacks the pool, the second has it.
        let fetch: &Fetch = &move |url| {
            Ok(Some(if url == "https://one/p/pools.json" {
                cat(r#"{"pool": "b/1", "form": "image", "source": "b/1.sheaf"}"#).into_bytes()
            } else {
                cat(r#"{"pool": "a/1", "form": "repository", "source": "a/1"}"#).into_bytes()
            }))
        };
        assert_eq!(c.find("a", "1", fetch).unwrap(), "https://two/p/a/1");
        assert_eq!(c.find("b", "1", fetch).unwrap(), "https://one/p/b/1.sheaf");
        assert!(c.find("c", "1", fetch).is_err());
        let (offers, bad) = c.avail(fetch);
        assert_eq!(offers.len(), 2);
        assert!(bad.is_empty());
        // An unreachable location is reported, not fatal.
        let down: &Fetch = &|_| Err("connection refused".into());
        let (offers, bad) = c.avail(down);
        assert!(offers.is_empty() && bad.len() == 2, "{bad:?}");
        let e = c.find("a", "1", down).unwrap_err().to_string();
        assert!(e.contains("connection refused"), "{e}");
    }

    #[test]
    fn shell_quoting_survives_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }
}
