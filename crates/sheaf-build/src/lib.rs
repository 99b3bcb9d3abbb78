//! Building sheaf images.
//!
//! Owns the write side of the pipeline: scanning a directory or reading a
//! tar stream ([`scan`], [`tar_input`]) or a caller's stream of entries
//! ([`entries`]), deciding the packing order, cutting data into blocks,
//! dedup and parallel compression ([`pack`]), and encoding metadata into
//! paged streams ([`meta`]). It knows the format through `sheaf-format`, and
//! nothing about caches or mounts.
//!
//! Every input whose files can be read in any order (a directory, the
//! merged view of a stack) is packed by one plan (`plan.rs`: packing order,
//! dictionary samples, pack boundaries, similarity groups); streams are
//! packed in the order they come.
//!
//! It reads images in two places: [`stack_input`], the merged view of
//! stacked layers (a `sheaf_read::Stack`) walked as entries, which is how
//! `sheaf merge` flattens them; and [`base`], the earlier image of an
//! incremental build (`--base`), whose blocks unchanged files keep.
//!
//! [`upper`] has the checks `sheaf commit` applies when packing the upper
//! directory of a writable overlay as a layer ([`Input::Upper`]); its names
//! and its lock are [`sheaf_format::layers`]'.
//!
//! The output is written to a temporary file beside the target and renamed
//! into place only when complete, so an interrupted or failed build never
//! leaves anything under the target name.

#![warn(missing_docs)]

pub mod base;
mod content_index;
pub mod dict;
pub mod entries;
pub mod input;
pub mod meta;
pub mod normalize;
pub mod options;
pub mod order;
pub mod pack;
mod plan;
pub mod rewrite;
pub mod scan;
pub mod similar;
pub mod stack_input;
pub mod tar_input;
pub mod tree;
pub mod upper;

pub use input::{Input, TarStream};
pub use options::{BuildError, BuildOptions, Compression};
pub use pack::Progress;

use order::prefetch_ranks;
use pack::{Out, Packer};
use sheaf_format::{
    superblock::{MAX_BLOCK, MAX_PAGE, MIN_BLOCK, MIN_PAGE},
    Header, SectionEntry, SectionKind, StreamDesc, StreamId, Superblock, Trailer, HEADER_LEN,
    SECTION_FLAG_REQUIRED,
};
use std::collections::HashMap;
use std::fs::File;
use std::io::BufWriter;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tree::{Kind, NodeId, Tree};

/// What a finished build reports.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BuildReport {
    /// Final image path.
    pub image: PathBuf,
    /// Image size in bytes.
    pub image_bytes: u64,
    /// Number of inodes.
    pub inodes: u64,
    /// Sum of regular-file sizes.
    pub logical_bytes: u64,
    /// Stored data bytes (after dedup and compression).
    pub stored_data_bytes: u64,
    /// Distinct data blocks.
    pub blocks: u64,
    /// Root digest, hex.
    pub root_digest: String,
    /// Entries left out under `--skip-errors`.
    pub skipped: Vec<String>,
    /// What an incremental build (`--base`) took from its base image.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base: Option<BaseReport>,
}

/// What an incremental build took from its base image and what it read.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct BaseReport {
    /// The base image.
    pub image: PathBuf,
    /// Regular files whose data was taken from the base, unread.
    pub reused_files: u64,
    /// Their logical bytes.
    pub reused_bytes: u64,
    /// Regular files read from the source and packed anew.
    pub packed_files: u64,
    /// Their logical bytes.
    pub packed_bytes: u64,
    /// Blocks copied from the base as stored (not recompressed).
    pub copied_blocks: u64,
    /// Their stored bytes.
    pub copied_stored_bytes: u64,
    /// Bytes of copied blocks no file of the new image uses (data of files
    /// changed or removed since the base).
    pub stale_bytes: u64,
}

/// Temporary output that is removed unless [`TempOut::commit`] is reached.
///
/// The output's directory may be writable by others (a shared pool
/// location, a scratch directory): the temporary is made there by
/// descriptor under an unpredictable name, `O_EXCL`, and renamed over the
/// output by descriptor (`sheaf_dir`), so a name planted there is never
/// written through.
struct TempOut {
    /// The temporary, for messages and the skip list.
    tmp: PathBuf,
    dest: PathBuf,
    dir: sheaf_dir::Dir,
    tmp_name: std::ffi::OsString,
    dest_name: std::ffi::OsString,
    done: bool,
}

impl TempOut {
    /// A temporary file beside `output`, removed unless committed.
    fn create(output: &Path) -> std::io::Result<(File, TempOut)> {
        let dir_path = match output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let fname = output.file_name().ok_or_else(|| {
            std::io::Error::new(std::io::ErrorKind::InvalidInput, "not a file name")
        })?;
        let dir = sheaf_dir::Dir::open(&dir_path)?;
        let (tmp_name, file) =
            dir.temp_file(&format!(".{}.sheaf-tmp.", fname.to_string_lossy()), "")?;
        // The image is made as a plain create would make it (0666 less the
        // umask); temporaries start 0600.
        sheaf_dir::set_mode(&file, 0o666 & !sheaf_dir::umask())?;
        Ok((
            file,
            TempOut {
                tmp: dir_path.join(&tmp_name),
                dest: output.to_path_buf(),
                dir,
                tmp_name,
                dest_name: fname.to_os_string(),
                done: false,
            },
        ))
    }
}

/// Flush and sync a finished image, then move it into place, unless the
/// build was cancelled or (without `force`) the output appeared meanwhile.
/// Returns the image's length.
fn finish_output(
    out: Out<BufWriter<File>>,
    guard: &mut TempOut,
    force: bool,
    cancel: &AtomicBool,
) -> Result<u64, BuildError> {
    let shown = out.path.clone();
    let out_err = |e: std::io::Error| BuildError::Output {
        path: shown.clone(),
        cause: e,
    };
    let len = out.pos;
    let file = out
        .into_inner()
        .into_inner()
        .map_err(|e| out_err(e.into_error()))?;
    file.sync_all().map_err(out_err)?;
    drop(file);
    if cancel.load(Ordering::Relaxed) {
        return Err(BuildError::Interrupted);
    }
    if !force && guard.dir.stat(&guard.dest_name).is_ok() {
        return Err(BuildError::Exists(shown));
    }
    guard
        .dir
        .rename(&guard.tmp_name, &guard.dest_name)
        .map_err(out_err)?;
    guard.done = true;
    Ok(len)
}

impl Drop for TempOut {
    fn drop(&mut self) {
        if !self.done {
            let _ = self.dir.remove_file(&self.tmp_name);
        }
    }
}

fn validate(opts: &BuildOptions) -> Result<(), BuildError> {
    let ok = |v: u32, lo: u32, hi: u32| v.is_power_of_two() && (lo..=hi).contains(&v);
    if !ok(opts.block_size, MIN_BLOCK, MAX_BLOCK) {
        return Err(BuildError::Option(format!(
            "block size must be a power of two from 4K to 64M, not {}",
            opts.block_size
        )));
    }
    if opts.pack_size != 0 && !ok(opts.pack_size, MIN_BLOCK, opts.block_size) {
        return Err(BuildError::Option(format!(
            "pack size must be a power of two from 4K to the block size ({}), not {}",
            opts.block_size, opts.pack_size
        )));
    }
    if !ok(opts.page_size, MIN_PAGE, MAX_PAGE) {
        return Err(BuildError::Option(format!(
            "page size must be a power of two from 4K to 1M, not {}",
            opts.page_size
        )));
    }
    Ok(())
}

/// The prefetch section: the data blocks of the listed files, in list
/// order, each once, as little-endian u32 ids.
fn prefetch_section(tree: &Tree, prefetch: &HashMap<&[u8], usize>) -> Vec<u8> {
    if prefetch.is_empty() {
        return Vec::new(); // without building an entry index of the whole tree
    }
    let index = tree.entry_index();
    let mut files: Vec<(usize, NodeId)> = prefetch_ranks(tree, &index, prefetch)
        .into_iter()
        .map(|(id, r)| (r, id))
        .collect();
    files.sort();
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for (_, id) in files {
        if let Kind::File { first, count, .. } = tree.nodes[id as usize].kind {
            for c in &tree.chunks[first as usize..first as usize + count as usize] {
                if !c.is_hole() && seen.insert(c.block) {
                    out.extend_from_slice(&c.block.to_le_bytes());
                }
            }
        }
    }
    out
}

/// Build an image from `input` into `output`.
pub fn build(
    input: &Input,
    output: &Path,
    opts: &BuildOptions,
    progress: Arc<Progress>,
    cancel: &AtomicBool,
) -> Result<BuildReport, BuildError> {
    validate(opts)?;
    let shown = output.display().to_string();
    let out_err = |e: std::io::Error| BuildError::Output {
        path: shown.clone(),
        cause: e,
    };
    if !opts.force && output.symlink_metadata().is_ok() {
        return Err(BuildError::Exists(shown));
    }
    let base = match (&opts.base, input) {
        (None, _) => None,
        (Some(p), Input::Dir(_)) => Some(base::Base::open(p, opts)?),
        // A tar stream has to be read through anyway, and the other inputs
        // have no stable (path, mtime) of their own to compare.
        (Some(_), _) => {
            return Err(BuildError::Option(
                "--base needs a directory as SOURCE (a tar archive is read through anyway)".into(),
            ))
        }
    };
    let (file, mut guard) = TempOut::create(output).map_err(out_err)?;
    let threads = if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    };
    let mut out = Out::new(BufWriter::with_capacity(4 << 20, file), 0, shown.clone());
    out.put(&Header::current().encode())?;
    let mut problems = scan::Problems::new(opts.skip_errors);
    let prefetch: HashMap<&[u8], usize> = opts
        .prefetch
        .iter()
        .enumerate()
        .rev() // the first mention of a path wins
        .map(|(i, p)| (p.as_slice(), i))
        .collect();
    let mut packer = Packer::with_extra_in_flight(
        out,
        opts.block_size,
        opts.compression.clone(),
        threads,
        if base.is_some() {
            Packer::<BufWriter<File>>::COPY_ROOM
        } else {
            0
        },
        progress.clone(),
    );
    packer.set_pack_size(opts.pack_block_size());
    packer.set_grouping(opts.group_blocks);
    packer.set_references(
        usize::try_from(opts.ref_window).unwrap_or(usize::MAX),
        &opts.compression,
    );
    if let Some(b) = &base {
        packer.set_base(&b.image, &b.refs);
        // New packs share PREV's dictionary: copied packs name it anyway,
        // and a second one would cost its bytes for nothing.
        if opts.dictionary {
            packer.set_dictionary(b.image.dictionaries().first().cloned());
        }
    }

    let mut base_report = None;
    let mut tree = match input {
        Input::Dir(src) | Input::Upper(src) => {
            // Never pack the image into itself when it is written inside SOURCE.
            let mut skip = Vec::new();
            for p in [&guard.tmp, &guard.dest] {
                if let Ok(m) = std::fs::metadata(p) {
                    use std::os::unix::fs::MetadataExt;
                    skip.push((m.dev(), m.ino()));
                }
            }
            let dir = DirInput {
                src,
                upper: matches!(input, Input::Upper(_)),
                skip: &skip,
                prefetch: &prefetch,
                base: base.as_ref(),
            };
            let (tree, rep) = dir.read(opts, &mut packer, &mut problems, &progress, cancel)?;
            base_report = rep;
            tree
        }
        Input::TarFile(p) => {
            let f = File::open(p).map_err(|e| BuildError::Input {
                path: p.display().to_string(),
                cause: e,
            })?;
            let name = p.display().to_string();
            tar_input::read_tar(f, &name, opts, &mut packer, &mut problems, cancel)?
        }
        Input::Entries(src) => entries::read_entries(
            &**src,
            opts,
            &prefetch,
            &mut packer,
            &mut problems,
            &progress,
            cancel,
        )?,
        Input::Layer(stream) => tar_input::read_layer(
            stream,
            &stream.name,
            opts,
            &mut packer,
            &mut problems,
            cancel,
        )?,
        Input::TarStdin => tar_input::read_tar(
            std::io::stdin().lock(),
            "<stdin>",
            opts,
            &mut packer,
            &mut problems,
            cancel,
        )?,
    };
    let copied = packer.copied_blocks;
    let (mut out, block_refs, chunks, dicts, ref_bases) = packer.finish()?;
    if let Some(r) = &mut base_report {
        (r.copied_blocks, r.copied_stored_bytes) = copied;
    }
    if cancel.load(Ordering::Relaxed) {
        return Err(BuildError::Interrupted);
    }
    tree.chunks = chunks;
    let stored_data_bytes = out.pos - HEADER_LEN as u64;
    let logical_bytes = logical_bytes(&tree);

    let stats = tree_stats(&tree);
    let xattr_sets = tree.xattr_sets.len();

    // Metadata streams, compressed in parallel on the build's thread count.
    // Each is encoded from the tree while it is written, a batch of pages
    // at a time: peak memory is the tree, not the tree and its encoding.
    let layout = meta::Layout::new(&tree)?;
    let chunk_count = tree.chunks.len() as u64;
    let prefetch_bytes = prefetch_section(&tree, &prefetch);
    // A one-thread build compresses on the caller's thread: no pool, so no
    // thread is started or left ending after the build returns.
    let pool = if threads > 1 {
        Some(
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .map_err(|e| BuildError::Option(e.to_string()))?,
        )
    } else {
        None
    };
    let (inode_count, dirent_count) = (layout.inode_count(), layout.dirent_count);
    let mut descs: [StreamDesc; 5] = Default::default();
    for id in [
        StreamId::Inodes,
        StreamId::Chunks,
        StreamId::Dirents,
        StreamId::Heap,
        StreamId::Blocks,
    ] {
        let write = |out: &mut _| {
            let mut w =
                meta::PagedWriter::new(out, opts.page_size, &opts.compression, pool.is_some());
            match id {
                StreamId::Chunks => {
                    for c in &tree.chunks {
                        c.encode(w.buf());
                        w.flush_full()?;
                    }
                }
                StreamId::Blocks => {
                    for r in &block_refs {
                        w.buf().extend_from_slice(&r.encode());
                        w.flush_full()?;
                    }
                }
                _ => layout.encode(&tree, id, &mut w)?,
            }
            w.finish()
        };
        descs[id as usize] = match &pool {
            Some(pool) => pool.install(|| write(&mut out))?,
            None => write(&mut out)?,
        };
    }
    drop(layout);
    drop(tree);
    let sb = Superblock {
        required_features: sheaf_format::superblock::required_features_for(&block_refs),
        optional_features: if xattr_sets == 0 {
            sheaf_format::superblock::OPT_NO_XATTRS
        } else {
            0
        },
        block_size: opts.block_size,
        page_size: opts.page_size,
        inode_count,
        block_count: block_refs.len() as u64,
        chunk_count,
        dirent_count,
        logical_bytes,
        stored_data_bytes,
        root_inode: 0,
        streams: descs,
    };
    let (by_type, hardlinks) = stats;
    // Blocks and stored bytes per codec name.
    let mut codecs = std::collections::BTreeMap::<String, (u64, u64)>::new();
    for r in &block_refs {
        let c = codecs.entry(r.codec.name().to_string()).or_default();
        c.0 += 1;
        c.1 += r.clen as u64;
    }
    let ref_blocks = codecs
        .get(sheaf_format::Codec::ZstdRef.name())
        .map_or(0, |c| c.0);
    use sheaf_format::build_info::{BaseInfo, BuildInfo, BuildStats, DictionaryInfo};
    let info = BuildInfo {
        stats: Some(BuildStats {
            entries_by_type: Some(
                by_type
                    .into_iter()
                    .map(|(t, n)| (t.to_string(), n))
                    .collect(),
            ),
            hardlinked_inodes: Some(hardlinks),
            dedup_bytes: Some(progress.dedup_bytes.load(Ordering::Relaxed)),
            hole_bytes: Some(progress.hole_bytes.load(Ordering::Relaxed)),
            blocks_by_codec: Some(codecs.iter().map(|(c, n)| (c.clone(), n.0)).collect()),
            stored_by_codec: Some(codecs.into_iter().map(|(c, n)| (c, n.1)).collect()),
            xattr_sets: Some(xattr_sets as u64),
        }),
        builder: Some(format!("sheaf {}", env!("CARGO_PKG_VERSION"))),
        compression: Some(opts.compression.describe()),
        block_size: Some(opts.block_size),
        pack_size: Some(opts.pack_block_size()),
        page_size: Some(opts.page_size),
        owner: opts.owner.map(|(u, g)| format!("{u}:{g}")),
        mtime: opts.mtime,
        clamp_mtime: opts.clamp_mtime,
        exclude: Some(opts.exclude.clone()),
        order: Some(opts.order.name().to_string()),
        group_blocks: Some(opts.group_blocks),
        ref_window: Some(opts.ref_window),
        ref_blocks: Some(ref_blocks),
        // Provenance only: which image the unchanged files' blocks came from.
        base: base.as_ref().map(|b| BaseInfo {
            root: sheaf_format::hex(&b.image.root_digest()),
            max_stale_pct: opts.base_max_stale_pct,
        }),
        labels: opts.labels.clone(),
        dictionaries: dicts
            .iter()
            .map(|d| DictionaryInfo {
                digest: sheaf_format::hex(d.digest()),
                bytes: d.bytes().len() as u64,
            })
            .collect(),
        ..Default::default()
    };
    let dict_bytes = sheaf_format::dict::encode_section(&dicts);
    let trailer = write_tail(
        &mut out,
        vec![
            (SectionKind::BuildInfo, 0, info.encode()),
            (SectionKind::Prefetch, 0, prefetch_bytes),
            // Required: an image whose blocks name dictionaries cannot be
            // read without them.
            (SectionKind::Dictionaries, SECTION_FLAG_REQUIRED, dict_bytes),
            // Required likewise: reference blocks need their bases.
            (
                SectionKind::RefBases,
                SECTION_FLAG_REQUIRED,
                sheaf_format::reference::encode_section(&ref_bases),
            ),
            (SectionKind::Superblock, SECTION_FLAG_REQUIRED, sb.encode()),
        ],
    )?;
    let image_bytes = finish_output(out, &mut guard, opts.force, cancel)?;
    Ok(BuildReport {
        image: output.to_path_buf(),
        image_bytes,
        inodes: inode_count,
        logical_bytes,
        stored_data_bytes,
        blocks: block_refs.len() as u64,
        root_digest: sheaf_format::hex(&trailer.root_digest),
        skipped: problems.skipped,
        base: base_report,
    })
}

/// Write the sections (empty ones are left out), the section table and the
/// trailer: the end of every image, whoever assembled the rest.
fn write_tail<W: std::io::Write>(
    out: &mut Out<W>,
    sections: Vec<(SectionKind, u32, Vec<u8>)>,
) -> Result<Trailer, BuildError> {
    let mut entries = Vec::new();
    for (kind, flags, bytes) in sections {
        if bytes.is_empty() {
            continue;
        }
        let offset = out.put(&bytes)?;
        entries.push(SectionEntry {
            kind,
            flags,
            offset,
            length: bytes.len() as u64,
            hash: sheaf_format::digest(&bytes),
        });
    }
    let table: Vec<u8> = entries.iter().flat_map(|s| s.encode()).collect();
    let table_offset = out.put(&table)?;
    let trailer = Trailer {
        table_offset,
        section_count: entries.len() as u32,
        root_digest: sheaf_format::digest(&table),
    };
    out.put(&trailer.encode())?;
    Ok(trailer)
}

/// Remove files that could not be read from their directories (`--skip-errors`).
pub(crate) fn drop_nodes(tree: &mut Tree, ids: &[NodeId]) {
    if ids.is_empty() {
        return;
    }
    let gone: std::collections::HashSet<NodeId> = ids.iter().copied().collect();
    for n in &mut tree.nodes {
        if let Kind::Dir(e) = &mut n.kind {
            e.retain(|e| !gone.contains(&e.node));
        }
    }
    for &id in ids {
        tree.nodes[id as usize].links = 0;
    }
}

fn logical_bytes(tree: &Tree) -> u64 {
    tree.nodes
        .iter()
        .filter(|n| n.links > 0)
        .map(|n| match n.kind {
            Kind::File { size, .. } => size,
            _ => 0,
        })
        .sum()
}

/// Entries by type and the number of hardlinked non-directories.
fn tree_stats(tree: &Tree) -> (std::collections::BTreeMap<&'static str, u64>, u64) {
    let mut by_type = std::collections::BTreeMap::new();
    let mut hardlinks = 0u64;
    for (id, n) in tree.nodes.iter().enumerate().filter(|(_, n)| n.links > 0) {
        let mode = tree.mode(id as NodeId);
        let t = sheaf_format::FileType::from_mode(mode).map_or("other", |t| t.name());
        *by_type.entry(t).or_default() += 1;
        hardlinks += (n.links > 1 && !matches!(n.kind, Kind::Dir(_))) as u64;
    }
    (by_type, hardlinks)
}

/// A directory to pack (or an overlay's upper directory, as a layer).
struct DirInput<'a> {
    src: &'a Path,
    /// An upper directory: its temporaries are left out and its whiteouts
    /// checked.
    upper: bool,
    /// Files never packed (the output itself, by device and inode).
    skip: &'a [(u64, u64)],
    prefetch: &'a HashMap<&'a [u8], usize>,
    /// The image of an incremental build (`--base`).
    base: Option<&'a base::Base>,
}

impl DirInput<'_> {
    /// Scan the directory, then read its files in packing order
    /// ([`plan::Plan`]) into `packer`; the tree with every file's chunks.
    fn read<W: std::io::Write + Send + 'static>(
        &self,
        opts: &BuildOptions,
        packer: &mut Packer<W>,
        problems: &mut scan::Problems,
        progress: &Progress,
        cancel: &AtomicBool,
    ) -> Result<(Tree, Option<BaseReport>), BuildError> {
        let src = self.src;
        let mut tree = if self.upper {
            // The overlay's temporary files are left out (not recorded
            // as an option: they are never part of a layer).
            let mut o = opts.clone();
            o.exclude.push(sheaf_format::layers::TEMP_GLOB.to_string());
            let tree = scan::scan_dir(src, &o, problems, self.skip)?;
            upper::check_whiteouts(&tree, src)?;
            tree
        } else {
            scan::scan_dir(src, opts, problems, self.skip)?
        };
        let plan = plan::Plan::new(&tree, self.prefetch, opts);
        let (order, index) = (&plan.order, &plan.index);
        let size_of = plan::size_of;
        let base_plan = match self.base {
            Some(b) => {
                use std::os::unix::ffi::OsStrExt;
                let files: Vec<(NodeId, Vec<u8>)> = order
                    .iter()
                    .map(|&id| (id, tree.path(index, id).as_os_str().as_bytes().to_vec()))
                    .collect();
                Some(b.plan(&tree, &files, opts.clamp_mtime, opts.base_max_stale_pct)?)
            }
            None => None,
        };
        let reused = |id: NodeId| base_plan.as_ref().and_then(|p| p.reused.get(&id).copied());
        if self.base.is_none() && opts.trains_dictionary() {
            // A file that cannot be read here is left out of the samples;
            // the packing pass reports it.
            let samples = plan.samples(&tree, opts, |id, size| {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                    .open(src.join(plan.path(&tree, id)))
                    .ok()?;
                let mut b = Vec::with_capacity(size as usize);
                std::io::Read::read_to_end(&mut std::io::Read::take(f, size), &mut b).ok()?;
                Some(b)
            });
            packer.set_dictionary(plan::Plan::train(&samples));
        }
        // What is read from the source (reused files are not).
        let total: u64 = order
            .iter()
            .filter(|&&id| reused(id).is_none())
            .map(|&id| size_of(&tree, id))
            .sum();
        plan.announce(packer, progress, total);
        let mut rep = self.base.map(|b| BaseReport {
            image: PathBuf::from(&b.name),
            stale_bytes: base_plan.as_ref().map_or(0, |p| p.stale_bytes),
            ..Default::default()
        });
        // Reused files PREV stored once (identical content) share one new
        // chunk range too.
        let mut shared: HashMap<(u64, u32), (u64, u32)> = HashMap::new();
        // The pack of the `--base` image holding a reused small file, by
        // the file's similarity group: a new file of that group is a new
        // version, and its pack is compressed against that one
        // (Packer::set_version_in).
        let mut versions_in: HashMap<u64, u32> = HashMap::new();
        if let Some(b) = self.base.filter(|_| opts.group_blocks) {
            use std::os::unix::ffi::OsStrExt;
            for &id in order {
                let Some((pf, 1)) = reused(id) else { continue };
                let c = b.chunks(pf, 1)[0];
                if !c.is_hole() && (size_of(&tree, id) as usize) < opts.pack_block_size() as usize {
                    let g = order::group_key(tree.path(index, id).as_os_str().as_bytes());
                    versions_in.insert(g, c.block);
                }
            }
        }
        let mut unreadable = Vec::new();
        // Files come grouped by directory: keep the current one's handle.
        let mut dir: Option<(NodeId, PathBuf, Option<File>)> = None;
        for &id in order {
            if cancel.load(Ordering::Relaxed) {
                return Err(BuildError::Interrupted);
            }
            if let (Some((pf, pc)), Some(b), Some(r)) = (reused(id), self.base, rep.as_mut()) {
                let size = size_of(&tree, id);
                let (first, count) = match shared.get(&(pf, pc)) {
                    Some(&range) => range,
                    None => {
                        let range = packer.add_copied(&b.image, &b.refs, b.chunks(pf, pc))?;
                        shared.insert((pf, pc), range);
                        range
                    }
                };
                tree.nodes[id as usize].kind = Kind::File { size, first, count };
                r.reused_files += 1;
                r.reused_bytes += size;
                continue;
            }
            let rel = tree.path(index, id);
            let path = src.join(&rel);
            {
                use std::os::unix::ffi::OsStrExt;
                plan.start_file(packer, rel.as_os_str().as_bytes())?;
            }
            let parent = tree.nodes[id as usize].parent;
            if dir.as_ref().is_none_or(|d| d.0 != parent) {
                let parent_rel = rel.parent().unwrap_or(Path::new(""));
                dir = match scan::dir_handle(src, parent_rel) {
                    Ok((base, held)) => Some((parent, base, held)),
                    Err(e) => {
                        problems.handle(&path, e)?;
                        unreadable.push(id);
                        None
                    }
                };
            }
            let Some((_, base, _)) = &dir else { continue };
            // The entry was a regular file when scanned; if it has been
            // swapped for a symlink or a FIFO since, fail instead of
            // following it or blocking.
            let opened = std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
                .open(rel.file_name().map_or(path.clone(), |n| base.join(n)));
            let mut f = match opened {
                Ok(f) => f,
                Err(e) => {
                    problems.handle(&path, e)?;
                    unreadable.push(id);
                    continue;
                }
            };
            if let Some(b) = self.base {
                let old = packer.group().and_then(|g| versions_in.get(&g).copied());
                packer.set_version_in(&b.image, &b.refs, old)?;
            }
            match packer.add_file(&mut f, &path.display().to_string(), id, cancel) {
                Ok((size, range)) => {
                    tree.nodes[id as usize].kind = tree.file_kind(size, range);
                    if let Some(r) = rep.as_mut() {
                        r.packed_files += 1;
                        r.packed_bytes += size;
                    }
                }
                Err(BuildError::Input { path: p, cause }) if opts.skip_errors => {
                    problems.skipped.push(format!("{p}: {cause}"));
                    unreadable.push(id);
                }
                Err(e) => return Err(e),
            }
        }
        drop_nodes(&mut tree, &unreadable);
        Ok((tree, rep))
    }
}
