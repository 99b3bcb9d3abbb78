//! What `sheaf.open` opened: one image, or a stack of them seen as one
//! tree, and the operations the Python API needs on either.

use crate::error::Error;
use crate::pysource::PySource;
use crate::OpenArgs;
use sheaf_format::{FileType, FormatError};
use sheaf_read::{Found, Image, Inode, ReadError, Stack};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The `cache=` argument.
pub enum CacheArg {
    /// `cache=False`: no node cache.
    Off,
    /// `cache="DIR"`.
    Dir(PathBuf),
}

/// One entry's attributes.
pub struct Stat {
    /// The layer it is shown from (0 for one image).
    pub layer: usize,
    /// Its inode there.
    pub ino: Inode,
    /// A symlink's target.
    pub target: Option<Vec<u8>>,
}

/// Where a stored piece of a file is: (file offset, length, block id,
/// block offset in the image, stored length of the block).
pub type Piece = (u64, u32, u32, u64, u32);

/// A listing: each name, with its attributes when asked for.
pub type Listing = Vec<(Vec<u8>, Option<Stat>)>;

/// An open image or stack.
pub struct View {
    /// The source as named, redacted (no credentials are kept).
    name: String,
    /// Each layer as the user named it, redacted, bottom first.
    names: Vec<String>,
    layers: Vec<Arc<Image>>,
    /// Set when there are several layers.
    stack: Option<Stack>,
    /// Layers whose server was unreachable, and when the index that stood
    /// in for it was cached (seconds since the epoch).
    offline: Vec<(String, u64)>,
}

/// Cache sizes of every image the package opens. The pages' cache is four
/// times the library's default: a Python program looks paths up at random
/// (a shuffled file list), with no kernel dentry cache in front as a mount
/// has, and a 1M-entry image has about 110 MiB of metadata; 64 MiB of it
/// cached made every lookup decode pages again. Memory is used only as
/// pages are read.
const OPTIONS: sheaf_read::ImageOptions = sheaf_read::ImageOptions {
    block_cache_bytes: 256 << 20,
    page_cache_bytes: 256 << 20,
};

/// Most symlinks followed in one resolution (as the kernel and the reader).
const MAX_LINKS: usize = 40;

/// A size with an optional K/M/G/T suffix (powers of 1024), as the CLI's
/// `--cache-size` and `SHEAF_CACHE_SIZE` take it.
fn parse_size(s: &str) -> Option<u64> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix('B'))
        .unwrap_or(t);
    let (num, shift) = match t.chars().last()? {
        'K' | 'k' => (&t[..t.len() - 1], 10),
        'M' | 'm' => (&t[..t.len() - 1], 20),
        'G' | 'g' => (&t[..t.len() - 1], 30),
        'T' | 't' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1u64 << shift)
}

/// The remote settings the CLI uses when given no flags: its environment
/// variables (`SHEAF_CACHE_DIR`, `SHEAF_CACHE_SIZE`, `SHEAF_PROXY`) and
/// defaults; `cache=` stands for `--cache-dir` / `--no-cache`.
fn remote_config(cache: Option<&CacheArg>) -> Result<sheaf_net::RemoteConfig, Error> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    let cache_quota = match env("SHEAF_CACHE_SIZE") {
        Some(s) => parse_size(&s).ok_or_else(|| {
            Error::Value(format!(
                "SHEAF_CACHE_SIZE={s}: not a size (examples: 512M, 10G)"
            ))
        })?,
        None => 10 << 30,
    };
    let proxies = env("SHEAF_PROXY")
        .iter()
        .flat_map(|l| l.split([';', ',']))
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .collect();
    Ok(sheaf_net::RemoteConfig {
        cache_dir: match cache {
            Some(CacheArg::Dir(d)) => Some(d.clone()),
            _ => env("SHEAF_CACHE_DIR").map(PathBuf::from),
        },
        cache_quota,
        no_cache: matches!(cache, Some(CacheArg::Off)),
        http: sheaf_net::HttpOptions {
            proxies,
            ..Default::default()
        },
    })
}

/// A source as it may be shown (repr, `source`, `info()`, messages): a
/// URL's credentials redacted. The string with them is only passed to
/// `open_image`.
fn shown(s: &str) -> String {
    sheaf_net::SecretUrl::new(s).to_string()
}

fn lossy(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

impl View {
    /// Open what `a` names and apply the signature policy to every image.
    pub fn open(a: &OpenArgs, size: Option<u64>) -> Result<View, Error> {
        let policy =
            sheaf_trust::Policy::load(a.require_signature, a.signers.clone(), a.identity.clone())?;
        let s = &a.source;
        let mut names = Vec::new();
        let mut layers = Vec::new();
        let mut offline = Vec::new();
        if let (Some(reader), Some(len)) = (&a.reader, size) {
            let src = PySource::new(shown(s), len, reader);
            layers.push(Arc::new(Image::open_with(Arc::new(src), OPTIONS)?));
            names.push(shown(s));
        } else {
            let cfg = remote_config(a.cache.as_ref())?;
            let parts: Vec<&str> =
                if s.contains(',') && !sheaf_net::is_url(s) && !Path::new(s).exists() {
                    s.split(',').collect()
                } else {
                    vec![s.as_str()]
                };
            for p in parts {
                let o = sheaf_net::open_image(Path::new(p), &cfg, OPTIONS, |s| s)?;
                if let Some(t) = o.offline_since {
                    let at = t.duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
                    offline.push((sheaf_net::redact(p), at.as_secs()));
                }
                layers.push(Arc::new(o.image));
                names.push(shown(p));
            }
        }
        for (img, name) in layers.iter().zip(&names) {
            policy.enforce(&img.signed_message(), img.signatures(), Path::new(name))?;
        }
        let stack = (layers.len() > 1).then(|| Stack::new(layers.clone()));
        Ok(View {
            name: shown(s),
            names,
            layers,
            stack,
            offline,
        })
    }

    /// Layers opened from a cached index because their server was
    /// unreachable: (name, when the index was cached).
    pub fn offline(&self) -> &[(String, u64)] {
        &self.offline
    }

    /// The source as named, its credentials redacted.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The images, bottom first.
    pub fn layers(&self) -> &[Arc<Image>] {
        &self.layers
    }

    /// `sheaf info --json` for each layer (an array for a stack).
    pub fn info_json(&self, whiteouts: bool) -> Result<String, Error> {
        let describe = |s: &[u8]| sheaf_read::info::SignatureInfo::of(sheaf_trust::describe(s));
        let mut v = Vec::new();
        for (img, name) in self.layers.iter().zip(&self.names) {
            let wo = if whiteouts {
                Some(sheaf_read::info::whiteouts(img)?)
            } else {
                None
            };
            v.push(sheaf_read::info::info(img, name, wo.as_ref(), &describe)?);
        }
        let text = if v.len() == 1 {
            serde_json::to_string(&v[0])
        } else {
            serde_json::to_string(&v)
        };
        text.map_err(|e| Error::Value(e.to_string()))
    }

    /// What `path` names, symlinks followed in its last component when
    /// `follow` (and, in one image, in every component).
    fn resolve(&self, path: &[u8], follow: bool) -> Result<Found, Error> {
        let Some(stack) = &self.stack else {
            let img = &self.layers[0];
            let ino = if follow {
                img.resolve_follow(path)?
            } else {
                img.resolve(path)?
            };
            return Ok(if ino.file_type() == FileType::Directory {
                Found::Dir(sheaf_read::MergedDir {
                    parts: vec![(0, ino)],
                })
            } else {
                Found::Node(0, ino)
            });
        };
        let mut cur: Vec<u8> = path.to_vec();
        for _ in 0..=MAX_LINKS {
            let f = stack.resolve(&cur)?;
            let (layer, ino) = f.shown();
            if !follow || ino.file_type() != FileType::Symlink {
                return Ok(f);
            }
            let target = self.layers[layer].read_link(&ino)?;
            cur = if target.first() == Some(&b'/') {
                target
            } else {
                let mut base = match cur.iter().rposition(|&b| b == b'/') {
                    Some(i) => cur[..=i].to_vec(),
                    None => Vec::new(),
                };
                base.extend_from_slice(&target);
                base
            };
            cur = normalize(&cur);
        }
        Err(ReadError::TooManyLinks(lossy(path)).into())
    }

    /// Stat `path`.
    pub fn stat(&self, path: &[u8], follow: bool) -> Result<Stat, Error> {
        let (layer, ino) = self.resolve(path, follow)?.shown();
        self.stat_of(layer, ino)
    }

    fn stat_of(&self, layer: usize, ino: Inode) -> Result<Stat, Error> {
        let target = match ino.file_type() {
            FileType::Symlink => Some(self.layers[layer].read_link(&ino)?),
            _ => None,
        };
        Ok(Stat { layer, ino, target })
    }

    /// The directory `path` names (followed if a symlink), as a handle
    /// [`View::list`] takes: a walk lists each directory from its handle,
    /// never looking its path up from the root again.
    pub fn opendir(&self, path: &[u8]) -> Result<sheaf_read::MergedDir, Error> {
        match self.resolve(path, true)? {
            Found::Dir(d) => Ok(d),
            Found::Node(..) => Err(Error::NotDir(lossy(path))),
        }
    }

    /// The entries of directory `path` (followed if a symlink), sorted by
    /// name, with their attributes when `detail`.
    pub fn listdir(&self, path: &[u8], detail: bool) -> Result<Listing, Error> {
        let dir = self.opendir(path)?;
        Ok(self
            .list(&dir, detail, false)?
            .into_iter()
            .map(|(n, st, _)| (n, st))
            .collect())
    }

    /// The entries of `dir`, sorted by name, with their attributes when
    /// `detail` and, when `children`, each subdirectory's handle.
    #[allow(clippy::type_complexity)]
    pub fn list(
        &self,
        dir: &sheaf_read::MergedDir,
        detail: bool,
        children: bool,
    ) -> Result<Vec<(Vec<u8>, Option<Stat>, Option<sheaf_read::MergedDir>)>, Error> {
        let mut out = Vec::new();
        match &self.stack {
            None => {
                let img = &self.layers[0];
                let d = dir.parts[0].1;
                let n = img.dir_len(&d)?;
                for e in img.read_dir(&d, 0, n as usize)? {
                    let ino = if detail || (children && e.file_type == FileType::Directory) {
                        Some(img.child(&d, e.ino, e.file_type)?)
                    } else {
                        None
                    };
                    let sub = match ino {
                        Some(i) if children && i.file_type() == FileType::Directory => {
                            Some(sheaf_read::MergedDir {
                                parts: vec![(0, i)],
                            })
                        }
                        _ => None,
                    };
                    let st = match ino {
                        Some(i) if detail => Some(self.stat_of(0, i)?),
                        _ => None,
                    };
                    out.push((e.name, st, sub));
                }
            }
            Some(stack) => {
                for e in stack.read_dir(dir)? {
                    let st = if detail {
                        Some(self.stat_of(e.layer, stack.entry_inode(dir, &e)?)?)
                    } else {
                        None
                    };
                    let sub = if children && e.file_type == FileType::Directory {
                        match stack.lookup(dir, &e.name)? {
                            Some(Found::Dir(d)) => Some(d),
                            _ => None,
                        }
                    } else {
                        None
                    };
                    out.push((e.name, st, sub));
                }
            }
        }
        Ok(out)
    }

    /// A symlink's target.
    pub fn readlink(&self, path: &[u8]) -> Result<Vec<u8>, Error> {
        let (layer, ino) = self.resolve(path, false)?.shown();
        if ino.file_type() != FileType::Symlink {
            return Err(Error::NotAFile(format!(
                "{}: not a symbolic link",
                lossy(path)
            )));
        }
        Ok(self.layers[layer].read_link(&ino)?)
    }

    /// The regular file `path` names (symlinks followed).
    pub fn file(&self, path: &[u8]) -> Result<(usize, Inode), Error> {
        let (layer, ino) = self.resolve(path, true)?.shown();
        match ino.file_type() {
            FileType::Regular => Ok((layer, ino)),
            FileType::Directory => Err(Error::IsDir(lossy(path))),
            t => Err(Error::NotAFile(format!(
                "{}: not a regular file (a {})",
                lossy(path),
                t.name()
            ))),
        }
    }

    /// Files `paths` read whole, on the current rayon pool; each result in
    /// the order of `paths`. For a shuffled training list of small files:
    /// all are looked up first, their data blocks are read in the order
    /// they are stored (files of one block one after another, so the block
    /// is decoded once while it is cached; each thread takes a run of that
    /// order), and a local image is told what will be read so a cold disk
    /// reads it ahead in large requests: the metadata pages when the list
    /// is long against them, then the blocks.
    pub fn read_many(&self, paths: &[Vec<u8>]) -> Vec<Result<Vec<u8>, Error>> {
        use rayon::prelude::*;
        // A lookup reads a few pages: advise them all when that is a good
        // part of them anyway.
        for img in &self.layers {
            let pages: u64 = sheaf_format::StreamId::ALL
                .iter()
                .map(|&id| img.page_count(id, 0))
                .sum();
            if paths.len() as u64 * 4 >= pages {
                let _ = img.advise_metadata();
            }
        }
        let found: Vec<Result<(usize, Inode, u32), Error>> = paths
            .par_iter()
            .map(|p| {
                let (layer, ino) = self.file(p)?;
                let first = self.layers[layer].file_blocks(&ino)?.first().copied();
                Ok((layer, ino, first.unwrap_or(u32::MAX)))
            })
            .collect();
        let mut out: Vec<Option<Result<Vec<u8>, Error>>> = (0..paths.len()).map(|_| None).collect();
        let mut todo: Vec<(usize, usize, Inode, u32)> = Vec::new();
        for (i, f) in found.into_iter().enumerate() {
            match f {
                Ok((layer, ino, block)) => todo.push((i, layer, ino, block)),
                Err(e) => out[i] = Some(Err(e)),
            }
        }
        for (layer, img) in self.layers.iter().enumerate() {
            let ids: Vec<u32> = todo
                .iter()
                .filter(|t| t.1 == layer && t.3 != u32::MAX)
                .map(|t| t.3)
                .collect();
            let _ = img.advise_blocks(&ids);
        }
        todo.sort_by_key(|t| (t.1, t.3, t.2.ino));
        let read: Vec<(usize, Result<Vec<u8>, Error>)> = todo
            .par_iter()
            .map_init(
                sheaf_read::BlockScratch::default,
                |scratch, (i, layer, ino, _)| {
                    let name = lossy(&paths[*i]);
                    let r = crate::error::guard(|| {
                        self.read_at_via(*layer, ino, 0, usize::MAX, &name, Some(scratch))
                    });
                    (*i, r)
                },
            )
            .collect();
        for (i, r) in read {
            out[i] = Some(r);
        }
        out.into_iter()
            .map(|r| r.expect("every index read"))
            .collect()
    }

    /// How many bytes a read of up to `len` bytes at `offset` of `ino`
    /// gives (fewer only at its end).
    pub fn read_len(ino: &Inode, offset: u64, len: usize) -> usize {
        let left = ino.rec.size.saturating_sub(offset);
        usize::try_from(left).map_or(len, |l| l.min(len))
    }

    /// Bytes of file `ino` of `layer` from `offset` into `buf`, whose
    /// length is [`View::read_len`]'s: the caller's buffer (a Python bytes
    /// object) is the only one, so a large read costs its size once.
    pub fn read_into(
        &self,
        layer: usize,
        ino: &Inode,
        offset: u64,
        buf: &mut [u8],
        name: &str,
    ) -> Result<(), Error> {
        let img = &self.layers[layer];
        let want = buf.len();
        let mut at = 0usize;
        let mut over = false;
        let mut sink = |p| {
            let n = match &p {
                sheaf_read::Piece::Bytes(_, r) => r.len(),
                sheaf_read::Piece::Zeros(n) => *n,
            };
            let Some(dst) = at.checked_add(n).and_then(|e| buf.get_mut(at..e)) else {
                over = true;
                return;
            };
            match p {
                sheaf_read::Piece::Bytes(b, r) => dst.copy_from_slice(&b[r]),
                sheaf_read::Piece::Zeros(_) => dst.fill(0),
            }
            at += n;
        };
        img.read_pieces(ino, offset, want, &mut |_, _| {}, &mut sink)?;
        if over || at != want {
            return Err(Error::Value(format!(
                "{name}: the image gave {at} bytes for a read of {want}"
            )));
        }
        Ok(())
    }

    /// Up to `len` bytes of file `ino` of `layer` from `offset` (fewer
    /// only at its end); `name` names it in messages. A length that cannot
    /// be allocated is an error, not an abort. Blocks are decoded into
    /// `scratch` rather than the
    /// block cache when one is given ([`Image::read_pieces_scratch`]).
    fn read_at_via(
        &self,
        layer: usize,
        ino: &Inode,
        offset: u64,
        len: usize,
        name: &str,
        scratch: Option<&mut sheaf_read::BlockScratch>,
    ) -> Result<Vec<u8>, Error> {
        let img = &self.layers[layer];
        let left = ino.rec.size.saturating_sub(offset);
        let want = usize::try_from(left).map_or(len, |l| l.min(len));
        let mut out = Vec::new();
        out.try_reserve_exact(want).map_err(|_| {
            Error::Value(format!(
                "{name}: a read of {want} bytes does not fit in memory"
            ))
        })?;
        let mut sink = |p| match p {
            sheaf_read::Piece::Bytes(b, r) => out.extend_from_slice(&b[r]),
            sheaf_read::Piece::Zeros(n) => out.resize(out.len() + n, 0),
        };
        match scratch {
            Some(s) => img.read_pieces_scratch(ino, offset, want, s, &mut sink)?,
            None => img.read_pieces(ino, offset, want, &mut |_, _| {}, &mut sink)?,
        };
        Ok(out)
    }

    /// What find(1)'s expression `words` prints when run from `start` (the
    /// engine of `sheaf find`). One image only, as `sheaf find`.
    pub fn find(&self, start: &[u8], words: &[std::ffi::OsString]) -> Result<Vec<u8>, Error> {
        if self.stack.is_some() {
            return Err(Error::Value(format!(
                "{}: find reads one image; merge a stack first (sheaf merge)",
                self.name
            )));
        }
        let e = sheaf_read::find::parse(words)?;
        let start = sheaf_read::find::start_path(&String::from_utf8_lossy(start));
        Ok(sheaf_read::find::run(
            &self.layers[0],
            &start,
            &e,
            Vec::new(),
            None,
        )?)
    }

    /// The stored pieces of file `path` (see `Image.blocks` in lib.rs).
    pub fn blocks(&self, path: &[u8]) -> Result<Vec<Piece>, Error> {
        let (layer, ino) = self.file(path)?;
        let img = &self.layers[layer];
        let (start, n) = (ino.rec.data, u64::from(ino.rec.count));
        if start
            .checked_add(n)
            .is_none_or(|e| e > img.superblock().chunk_count)
        {
            return Err(ReadError::format(
                img.name(),
                &format!("inode {}", ino.ino),
                FormatError::invalid("inode", "chunks out of range"),
            )
            .into());
        }
        let mut out = Vec::new();
        for i in 0..n {
            let c = img.chunk(start + i)?;
            if c.is_hole() {
                continue;
            }
            let r = img.block_ref(c.block)?;
            out.push((c.file_offset, c.len, c.block, r.offset, r.clen));
        }
        Ok(out)
    }
}

/// `a/./b/../c` as `a/c` (a symlink's target joined to its directory;
/// `..` at the top stays there, as at an image's root).
fn normalize(p: &[u8]) -> Vec<u8> {
    let mut parts: Vec<&[u8]> = Vec::new();
    for c in p.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    parts.join(&b'/')
}
