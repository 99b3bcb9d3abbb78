//! The mount option language (`-o`, fstab's fourth field) and the argument
//! list mount(8) gives `mount.fuse.sheaf`: parsed once, for `sheaf mount`,
//! the helper, and the small front executable alike.

use anyhow::{anyhow, bail, Result};
use sheaf_mount::serve::MountConfig;
use sheaf_mount::{FsConfig, Readdirplus};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Parse a size such as `1M`, `256K`, `4096`, `2MiB`.
pub fn parse_size(s: &str) -> Result<u32, String> {
    parse_size64(s)
        .and_then(|n| u32::try_from(n).map_err(|_| format!("'{s}' is too large (at most 4G-1)")))
}

/// Parse a byte size with an optional K/M/G/T suffix (powers of 1024).
pub fn parse_size64(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, mul) = match t.chars().last() {
        Some('K' | 'k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('M' | 'm') => (&t[..t.len() - 1], 1 << 20),
        Some('G' | 'g') => (&t[..t.len() - 1], 1 << 30),
        Some('T' | 't') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| format!("'{s}' is not a size (examples: 64K, 1M, 4M)"))
}

/// The remote flags given as mount options (for fstab, where there are no
/// flags); each overrides its flag.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RemoteOptions {
    /// `cache_dir=`
    pub cache_dir: Option<PathBuf>,
    /// `cache_quota=`
    pub cache_quota: Option<u64>,
    /// `no_cache`
    pub no_cache: bool,
    /// `mirror=`, each
    pub mirrors: Vec<String>,
    /// `proxy=`
    pub proxy: Option<String>,
    /// `timeout=`
    pub timeout: Option<f64>,
    /// `failback=`
    pub failback: Option<f64>,
}

/// What follows a mount option's name, as completion offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OptionValue {
    /// Nothing: a switch (`allow_other`).
    Switch,
    /// `=` and a value of the user's (`mem_cache=1G`).
    Any,
    /// `=` and one of these words (`readdirplus=auto`).
    OneOf(&'static [&'static str]),
}

/// The `-o` options users write, for shell completion: every one
/// [`MountOptions::parse`] acts on, without `cache_size=` (the old name of
/// `mem_cache=`) and the fstab words it accepts and ignores.
pub const OFFERED: &[(&str, OptionValue)] = {
    use OptionValue::*;
    &[
        ("mem_cache", Any),
        ("threads", Any),
        ("readahead", Any),
        ("readdirplus", OneOf(&["auto", "always", "never"])),
        ("io_uring", OneOf(&["auto", "off"])),
        ("uid", Any),
        ("gid", Any),
        ("allow_other", Switch),
        ("allow_root", Switch),
        ("suid", Switch),
        ("nosuid", Switch),
        ("dev", Switch),
        ("nodev", Switch),
        ("exec", Switch),
        ("noexec", Switch),
        ("log", Any),
        ("debug", Switch),
        ("record", Any),
        ("prefetch", Any),
        ("prefetch_metadata", OneOf(&["on", "off"])),
        ("kernel", OneOf(&["auto", "require", "off"])),
        ("kernel_cache", Any),
        ("cache_dir", Any),
        ("cache_quota", Any),
        ("no_cache", Switch),
        ("mirror", Any),
        ("proxy", Any),
        ("timeout", Any),
        ("failback", Any),
    ]
};

/// Mount options after parsing `-o`.
#[derive(Debug, Clone)]
pub struct MountOptions {
    pub cache_size: usize,
    /// `threads=`; 0 for the default, counted by the server once the mount
    /// is ready (`sheaf_mount::serve::default_threads`).
    pub threads: usize,
    pub readahead: u32,
    pub readdirplus: Readdirplus,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub allow_other: bool,
    pub allow_root: bool,
    pub suid: bool,
    pub dev: bool,
    pub exec: bool,
    pub log: Option<PathBuf>,
    pub debug: bool,
    pub record: Option<PathBuf>,
    pub prefetch: Option<PathBuf>,
    pub prefetch_metadata: Option<bool>,
    /// `io_uring=auto|off`: FUSE over io_uring for single-image mounts
    /// when the kernel offers it.
    pub io_uring: bool,
    /// `kernel[=auto|require|off]`: serve the tree from the kernel's EROFS
    /// driver (root), the data still from sheaf (docs/mount.md).
    pub kernel: KernelPath,
    /// `kernel_cache=DIR`: where the kernel path keeps metadata images.
    pub kernel_cache: PathBuf,
    pub remote: RemoteOptions,
}

/// Whether a mount takes the kernel path (`-o kernel`, `--kernel`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KernelPath {
    /// FUSE only (the default).
    #[default]
    Off,
    /// The kernel path where it can be taken, else FUSE with one line
    /// saying why.
    Auto,
    /// The kernel path or nothing: where it cannot be taken, the mount fails.
    Require,
}

/// The site's switch for the mounts other processes ask for (`pool load`,
/// the containerd snapshotter, the Slurm plugin: `sheaf mount --request`),
/// in the site configuration's `[mount]` table:
///
/// ```toml
/// [mount]
/// kernel = "auto"                      # or "require", "off" (the default)
/// kernel_cache = "/var/cache/sheaf/kernel"
/// ```
///
/// As mount options (`kernel=...`, `kernel_cache=...`), which options
/// given to the request's `sheaf mount` override. A missing file or table
/// is nothing. Read only for root, the one user the kernel path serves.
pub fn site_mount_options(path: &Path) -> Result<Vec<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => bail!("{}: {}", path.display(), sheaf_format::one_line(&e)),
    };
    let v: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("{}: {}", path.display(), e.message()))?;
    let Some(m) = v.get("mount") else {
        return Ok(Vec::new());
    };
    let m = m
        .as_table()
        .ok_or_else(|| anyhow!("{}: [mount] is not a table", path.display()))?;
    let mut out = Vec::new();
    for (key, value) in m {
        let v = match (key.as_str(), value.as_str()) {
            ("kernel", Some(v @ ("auto" | "require" | "off"))) => v,
            ("kernel_cache", Some(v)) if Path::new(v).is_absolute() => v,
            ("kernel", _) => bail!(
                "{}: [mount] kernel must be \"auto\", \"require\" or \"off\"",
                path.display()
            ),
            ("kernel_cache", _) => {
                bail!(
                    "{}: [mount] kernel_cache must be an absolute path",
                    path.display()
                )
            }
            (k, _) => bail!(
                "{}: [mount] {k}: unknown (kernel and kernel_cache are known)",
                path.display()
            ),
        };
        out.push(format!("{key}={v}"));
    }
    Ok(out)
}

/// Where the kernel path keeps metadata images unless told
/// (`kernel_cache=`): root's, as the mounts are.
pub const KERNEL_CACHE: &str = "/var/cache/sheaf/kernel";

impl MountOptions {
    /// Parse `-o` lists. `from_fstab` also tolerates `rw`, which mount(8)
    /// may pass.
    pub fn parse(lists: &[String], from_fstab: bool) -> Result<MountOptions> {
        let mut p = MountOptions {
            cache_size: 256 << 20,
            threads: 0,
            readahead: 1,
            readdirplus: Readdirplus::default(),
            uid: None,
            gid: None,
            allow_other: false,
            allow_root: false,
            suid: false,
            dev: false,
            exec: true,
            log: None,
            debug: false,
            record: None,
            prefetch: None,
            prefetch_metadata: None,
            io_uring: true,
            kernel: KernelPath::Off,
            kernel_cache: PathBuf::from(KERNEL_CACHE),
            remote: RemoteOptions::default(),
        };
        for list in lists {
            for opt in list.split(',').map(str::trim).filter(|o| !o.is_empty()) {
                p.apply(opt, from_fstab)?;
            }
        }
        if p.allow_other && p.allow_root {
            bail!("mount options allow_other and allow_root exclude each other");
        }
        Ok(p)
    }

    fn apply(&mut self, opt: &str, from_fstab: bool) -> Result<()> {
        let p = self;
        let (key, val) = match opt.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (opt, None),
        };
        let need = || val.ok_or_else(|| anyhow!("mount option '{key}' needs a value ({key}=...)"));
        let num = |what: &str| -> Result<u64> {
            let v = need()?;
            v.parse::<u64>()
                .map_err(|_| anyhow!("mount option {key}={v}: {what} must be a number"))
        };
        match key {
            // cache_size= is mem_cache='s first name, kept for fstab lines.
            "mem_cache" | "cache_size" => {
                let v = need()?;
                p.cache_size =
                    parse_size64(v).map_err(|e| anyhow!("mount option {key}: {e}"))? as usize;
            }
            "threads" => {
                p.threads = num("threads")? as usize;
                if !(1..=256).contains(&p.threads) {
                    bail!("mount option threads={}: use 1..256", p.threads);
                }
            }
            "readahead" => p.readahead = num("readahead")?.min(64) as u32,
            "readdirplus" => {
                p.readdirplus = match need()? {
                    "auto" => Readdirplus::Auto,
                    "always" | "yes" => Readdirplus::Always,
                    "never" | "no" => Readdirplus::Never,
                    v => bail!("mount option readdirplus={v}: use auto, always or never"),
                }
            }
            "uid" => p.uid = Some(num("uid")? as u32),
            "gid" => p.gid = Some(num("gid")? as u32),
            "allow_other" => p.allow_other = true,
            "allow_root" => p.allow_root = true,
            "suid" => p.suid = true,
            "nosuid" => p.suid = false,
            "dev" => p.dev = true,
            "nodev" => p.dev = false,
            "exec" => p.exec = true,
            "noexec" => p.exec = false,
            "log" => p.log = Some(PathBuf::from(need()?)),
            "debug" => p.debug = true,
            "record" => p.record = Some(absolute(Path::new(need()?))),
            "prefetch" => p.prefetch = Some(PathBuf::from(need()?)),
            "prefetch_metadata" => {
                p.prefetch_metadata = Some(match need()? {
                    "on" | "yes" | "1" => true,
                    "off" | "no" | "0" => false,
                    v => bail!("mount option prefetch_metadata={v}: use on or off"),
                })
            }
            "io_uring" => {
                p.io_uring = match need()? {
                    "auto" | "on" | "yes" => true,
                    "off" | "no" | "never" => false,
                    v => bail!("mount option io_uring={v}: use auto or off"),
                }
            }
            "kernel" => {
                p.kernel = match val.unwrap_or("auto") {
                    "auto" | "on" | "yes" => KernelPath::Auto,
                    "require" => KernelPath::Require,
                    "off" | "no" | "never" => KernelPath::Off,
                    v => bail!("mount option kernel={v}: use auto, require or off"),
                }
            }
            "kernel_cache" => p.kernel_cache = absolute(Path::new(need()?)),
            "cache_dir" => p.remote.cache_dir = Some(PathBuf::from(need()?)),
            "cache_quota" => {
                let v =
                    parse_size64(need()?).map_err(|e| anyhow!("mount option cache_quota: {e}"))?;
                p.remote.cache_quota = Some(v);
            }
            "no_cache" => p.remote.no_cache = true,
            "mirror" => p.remote.mirrors.push(need()?.to_string()),
            "proxy" => p.remote.proxy = Some(need()?.to_string()),
            "timeout" | "failback" => {
                let v = need()?;
                let secs: f64 = v
                    .parse()
                    .map_err(|_| anyhow!("mount option {key}={v}: seconds must be a number"))?;
                if key == "timeout" {
                    p.remote.timeout = Some(secs)
                } else {
                    p.remote.failback = Some(secs)
                }
            }
            "ro" | "defaults" | "auto" | "noauto" | "user" | "users" | "nouser" | "nofail"
            | "_netdev" | "async" | "atime" | "noatime" | "relatime" | "nodiratime" => {}
            "rw" if from_fstab => {}
            "rw" => bail!(
                "mount option 'rw': images are read-only; use --upper DIR for a writable overlay"
            ),
            k if k.starts_with("x-") || k == "comment" => {}
            _ => bail!("unknown mount option '{opt}' (see 'sheaf mount --help')"),
        }
        Ok(())
    }

    /// How a single image's entries are presented and read ahead (its
    /// prefetch list and metadata prefetch are decided with the image).
    pub fn fs_config(&self) -> FsConfig {
        FsConfig {
            uid: self.uid,
            gid: self.gid,
            prefetch_threads: usize::from(self.readahead > 0),
            prefetch_blocks: self.readahead,
            readdirplus: self.readdirplus,
            record: self.record.clone(),
            ..Default::default()
        }
    }

    /// The kernel mount's settings.
    pub fn mount_config(&self, mountpoint: PathBuf, fsname: String, writable: bool) -> MountConfig {
        MountConfig {
            writable,
            direct: false,
            io_uring: false,
            mountpoint,
            fsname,
            fs: FsConfig::default(),
            threads: self.threads,
            allow_other: self.allow_other,
            allow_root: self.allow_root,
            suid: self.suid,
            dev: self.dev,
            exec: self.exec,
        }
    }
}

/// An absolute form of `p` without touching it (a dead mount cannot be stat'ed).
pub fn absolute(p: &Path) -> PathBuf {
    if let Ok(c) = p.canonicalize() {
        return c;
    }
    std::path::absolute(p).unwrap_or_else(|_| p.to_path_buf())
}

/// The source of a local image's mount as `/proc/mounts` shows it.
pub fn local_fsname(image: &Path) -> String {
    image
        .canonicalize()
        .unwrap_or_else(|_| image.to_path_buf())
        .display()
        .to_string()
}

/// What mount(8) asks of `mount.fuse.sheaf`.
#[derive(Debug, PartialEq)]
pub struct HelperArgs {
    pub image: PathBuf,
    pub mountpoint: PathBuf,
    pub options: Vec<String>,
    pub foreground: bool,
}

/// Parse `mount.fuse.sheaf IMAGE MOUNTPOINT [-o OPTS] [-n] [-s] [-f] [-v]
/// [-t TYPE]` (`args` without the program name).
pub fn helper_args(args: Vec<OsString>) -> Result<HelperArgs> {
    let mut pos = Vec::new();
    let mut options = Vec::new();
    let mut foreground = false;
    let mut it = args.into_iter();
    while let Some(a) = it.next() {
        match a.to_str() {
            Some("-o") => {
                let v = it.next().ok_or_else(|| anyhow!("-o needs a value"))?;
                options.push(v.into_string().map_err(|_| anyhow!("-o: not UTF-8"))?);
            }
            Some(s) if s.starts_with("-o") => options.push(s[2..].to_string()),
            Some("-t" | "-N") => {
                it.next();
            }
            Some("-f") => foreground = true,
            Some("-n" | "-s" | "-v" | "-r" | "-w") => {}
            Some(s) if s.starts_with('-') && s.len() > 1 => bail!("unknown option {s}"),
            _ => pos.push(PathBuf::from(a)),
        }
    }
    let [image, mountpoint] = <[PathBuf; 2]>::try_from(pos)
        .map_err(|_| anyhow!("usage: mount.fuse.sheaf IMAGE MOUNTPOINT [-o OPTIONS]"))?;
    Ok(HelperArgs {
        image,
        mountpoint,
        options,
        foreground,
    })
}

/// Whether the program was run by mount(8) as its helper for `-t fuse.sheaf`.
pub fn is_helper(argv0: Option<&std::ffi::OsStr>) -> bool {
    argv0
        .and_then(|p| Path::new(p).file_name())
        .is_some_and(|n| n == "mount.fuse.sheaf" || n == "mount.sheaf")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_parse_and_refuse_clearly() {
        let p = MountOptions::parse(
            &["cache_size=1G,uid=5".into(), "allow_other,noexec".into()],
            false,
        )
        .unwrap();
        assert_eq!(p.cache_size, 1 << 30);
        assert_eq!(p.uid, Some(5));
        assert!(p.allow_other && !p.exec && !p.suid && !p.dev);
        assert_eq!(p.remote, RemoteOptions::default());
        let e = |s: &str| {
            MountOptions::parse(&[s.into()], false)
                .err()
                .unwrap()
                .to_string()
        };
        assert!(e("bogus").contains("unknown mount option 'bogus'"));
        assert!(e("rw").contains("read-only"));
        assert!(e("uid=x").contains("uid=x"));
        assert!(e("cache_size").contains("needs a value"));
        assert!(e("allow_other,allow_root").contains("exclude"));
        assert!(
            MountOptions::parse(&["defaults,rw,noauto,x-systemd.automount".into()], true).is_ok()
        );
        let r = MountOptions::parse(
            &["mirror=a,mirror=b,timeout=2.5,cache_quota=1M".into()],
            false,
        )
        .unwrap()
        .remote;
        assert_eq!(r.mirrors, ["a", "b"]);
        assert_eq!((r.timeout, r.cache_quota), (Some(2.5), Some(1 << 20)));
    }

    /// Every option completion offers is one the parser takes, with each
    /// of its listed values; and it takes no other option than these, the
    /// old name and the ignored fstab words (found by trying every word of
    /// the parser's source that could be an option name).
    #[test]
    fn offered_options_are_the_parsed_ones() {
        for (name, v) in OFFERED {
            let tries: Vec<String> = match v {
                OptionValue::Switch => vec![name.to_string()],
                OptionValue::Any => vec![format!("{name}=1")],
                OptionValue::OneOf(vs) => vs.iter().map(|x| format!("{name}={x}")).collect(),
            };
            for t in tries {
                MountOptions::parse(std::slice::from_ref(&t), false)
                    .unwrap_or_else(|e| panic!("{t}: {e}"));
            }
        }
        let src = include_str!("options.rs");
        let body = src
            .split("fn apply(")
            .nth(1)
            .and_then(|b| b.split("fn fs_config").next())
            .unwrap();
        let ignored = [
            "cache_size",
            "ro",
            "defaults",
            "auto",
            "noauto",
            "user",
            "users",
            "nouser",
            "nofail",
            "_netdev",
            "async",
            "atime",
            "noatime",
            "relatime",
            "nodiratime",
            "rw",
            "comment",
        ];
        for word in body.split('"').skip(1).step_by(2) {
            let arm = format!("\"{word}\" =>");
            let or = format!("\"{word}\" |");
            let is_key = body.contains(&arm) || body.contains(&or);
            if !is_key || ignored.contains(&word) {
                continue;
            }
            // A value word of an option (`"auto" | "on"`) parses as no option.
            let as_opt = |o: &str| MountOptions::parse(&[o.into()], false);
            let known = as_opt(word).is_ok()
                || as_opt(&format!("{word}=1"))
                    .err()
                    .is_none_or(|e| !e.to_string().contains("unknown mount option"));
            if known {
                assert!(
                    OFFERED.iter().any(|(n, _)| *n == word),
                    "mount option {word} is not offered to completion"
                );
            }
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1M"), Ok(1 << 20));
        assert_eq!(parse_size("64KiB"), Ok(64 << 10));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert!(parse_size("8G").is_err());
        assert!(parse_size("x").is_err());
    }

    #[test]
    fn helper_arguments_as_mount_8_passes_them() {
        let a = |v: &[&str]| helper_args(v.iter().map(OsString::from).collect());
        let h = a(&[
            "img",
            "/mnt",
            "-o",
            "ro,cache_size=1G",
            "-n",
            "-t",
            "fuse.sheaf",
        ])
        .unwrap();
        assert_eq!(h.image, Path::new("img"));
        assert_eq!(h.mountpoint, Path::new("/mnt"));
        assert_eq!(h.options, ["ro,cache_size=1G"]);
        assert!(!h.foreground);
        assert!(a(&["img"]).is_err());
        assert!(a(&["img", "/mnt", "-x"]).is_err());
    }
}
