//! The writer: walk the image, lay every inode out, write the bytes.
//!
//! Three passes over what the walk collected, none over the image again
//! except for symbolic links' targets: the walk (every directory listed
//! once, breadth first, so that a directory's children lie together),
//! the layout (each inode's place, from sizes alone: a child's number is
//! not needed to know how long its parent's entries are) and the write
//! (one sequential stream).

use crate::map::BlobMap;
use crate::{ErofsError, BLOCK};
use sheaf_format::{FileType, InodeRecord};
use sheaf_read::{Found, Image, Inode, MergedDir, Seen, SeenMerged, Stack};
use std::collections::HashMap;
use std::io::{self, Write};

/// Where the superblock starts.
const SUPER_OFFSET: u64 = 1024;
/// EROFS's magic number.
const MAGIC: u32 = 0xE0F5_E1E2;
/// Feature bits (incompatible): chunk-based files, a device table.
const INCOMPAT_CHUNKED_FILE: u32 = 0x4;
const INCOMPAT_DEVICE_TABLE: u32 = 0x8;
/// Where the device table starts (right after the superblock), in 128-byte slots.
const DEVT_SLOTOFF: u16 = 9;
/// Where the first inode may go: after the superblock and the one slot.
const FIRST_INODE: u64 = (DEVT_SLOTOFF as u64 + 1) * 128;
/// Inode sizes (EROFS_INODE_LAYOUT_COMPACT / _EXTENDED).
const COMPACT: u64 = 32;
const EXTENDED: u64 = 64;
/// Data layouts (`i_format` bits 1..3).
const FLAT_PLAIN: u16 = 0;
const FLAT_INLINE: u16 = 2;
const CHUNK_BASED: u16 = 4;
/// Chunk format: 8-byte indexes (they carry the device id).
const CHUNK_INDEXES: u16 = 0x20;
/// The largest chunk: `BLOCK << 31`.
const MAX_CHUNK_BITS: u32 = 12 + 31;
/// One directory entry on disk.
const DIRENT: u64 = 12;
/// The longest name EROFS takes.
const NAME_MAX: usize = 255;

/// What [`write`] made.
#[derive(Debug)]
pub struct Written {
    /// Which blob range is which file.
    pub map: BlobMap,
    /// Inodes in the metadata image.
    pub inodes: u64,
    /// Directory entries (every name, `.` and `..` not counted).
    pub entries: u64,
    /// Bytes of the metadata image.
    pub bytes: u64,
}

/// One inode to write.
struct Node {
    rec: InodeRecord,
    /// For a directory: its entries in `Walk::entries`; its parent's node.
    kids: (u32, u32),
    parent: u32,
    /// Extended attributes, encoded (EROFS inline xattrs), in `Walk::xattrs`.
    xattrs: (u32, u32),
    /// The sheaf inode, and the layer it is in (0 for one image).
    ino: u32,
    layer: u32,
}

/// A directory entry: its name in `Walk::names`, the node it names.
struct Entry {
    name_at: usize,
    name_len: u8,
    node: u32,
}

#[derive(Default)]
struct Walk {
    nodes: Vec<Node>,
    entries: Vec<Entry>,
    names: Vec<u8>,
    xattrs: Vec<u8>,
}

impl Walk {
    /// Directory node `i`'s entries are those from `first` on: sort them
    /// (EROFS looks names up by binary search over bytes) and keep where
    /// they are.
    fn close_dir(&mut self, i: usize, first: u32) {
        let last = self.entries.len() as u32;
        let names = &self.names;
        self.entries[first as usize..last as usize]
            .sort_unstable_by(|a, b| name(names, a).cmp(name(names, b)));
        self.nodes[i].kids = (first, last);
    }
}

/// What is walked: one image as its own mount shows it (a name like
/// `.wh.x` is a file there), or a stack's merged view (whiteouts applied,
/// directories merged), as the union shows it.
#[derive(Clone, Copy)]
enum Tree<'a> {
    One(&'a Image),
    Many(&'a Stack),
}

impl Tree<'_> {
    fn image(&self, layer: u32) -> &Image {
        match self {
            Tree::One(img) => img,
            Tree::Many(s) => &s.layers()[layer as usize],
        }
    }
}

/// Write EROFS metadata for `img`'s tree to `out`, and return the blob map
/// that goes with it.
pub fn write(img: &Image, out: &mut dyn Write) -> Result<Written, ErofsError> {
    write_tree(Tree::One(img), out)
}

/// [`write`] for the merged view of a stack of layers (bottom first): OCI
/// whiteouts applied and never shown, directories merged, each entry from
/// the layer that shows it, a merged directory's link count 2 plus its
/// subdirectories; the blob map's ranges name their layer.
pub fn write_stack(stack: &Stack, out: &mut dyn Write) -> Result<Written, ErofsError> {
    write_tree(Tree::Many(stack), out)
}

fn write_tree(tree: Tree<'_>, out: &mut dyn Write) -> Result<Written, ErofsError> {
    let w = match tree {
        Tree::One(img) => walk(img)?,
        Tree::Many(stack) => walk_stack(stack)?,
    };
    let plan = lay_out(&w)?;
    let mut out = Counting {
        inner: io::BufWriter::with_capacity(1 << 20, out),
        at: 0,
    };
    emit(tree, &w, &plan, &mut out)?;
    out.inner.flush()?;
    Ok(Written {
        inodes: w.nodes.len() as u64,
        entries: w.entries.len() as u64,
        bytes: out.at,
        map: plan.map,
    })
}

fn unsupported(what: String) -> ErofsError {
    ErofsError::Unsupported(what)
}

/// Breadth-first: every directory listed once (a tree that lists one twice
/// is refused, as in every walk of an image), files with several links
/// one node.
fn walk(img: &Image) -> Result<Walk, ErofsError> {
    let root = img.root()?;
    let mut seen = Seen::new(img);
    let mut w = Walk::default();
    let mut links: HashMap<u32, u32> = HashMap::new();
    add_node(img, &mut w, &root, 0, 0)?;
    let mut i = 0;
    while i < w.nodes.len() {
        if w.nodes[i].rec.file_type() != Some(FileType::Directory) {
            i += 1;
            continue;
        }
        let dir = Inode {
            ino: w.nodes[i].ino,
            rec: w.nodes[i].rec,
        };
        seen.enter(img, &dir)?;
        let n = img.dir_len(&dir)? as usize;
        let (mut spans, mut inos, mut types) = (Vec::new(), Vec::new(), Vec::new());
        let mut bad = None;
        img.read_dir_each(&dir, 0, n, &mut |name, ino, t| {
            if name.len() > NAME_MAX && bad.is_none() {
                bad = Some(name.len());
            }
            spans.push((w.names.len(), name.len().min(NAME_MAX) as u8));
            w.names.extend_from_slice(name);
            inos.push(ino);
            types.push(t);
        })?;
        if let Some(len) = bad {
            return Err(unsupported(format!("a name of {len} bytes (at most 255)")));
        }
        let kids = img.inodes(&inos)?;
        let first = w.entries.len() as u32;
        for (((name_at, name_len), kid), t) in spans.into_iter().zip(kids).zip(types) {
            img.check_child(&dir, &kid, t)?;
            let several = t != FileType::Directory && kid.rec.nlink > 1;
            let node = match several.then(|| links.get(&kid.ino)).flatten() {
                Some(&n) => n,
                None => {
                    let n = add_node(img, &mut w, &kid, 0, i as u32)?;
                    if several {
                        links.insert(kid.ino, n);
                    }
                    n
                }
            };
            w.entries.push(Entry {
                name_at,
                name_len,
                node,
            });
        }
        w.close_dir(i, first);
        i += 1;
    }
    Ok(w)
}

/// The merged view's walk: as [`walk`], over [`Stack::children`] (every
/// merged directory entered once in each of its layers).
fn walk_stack(stack: &Stack) -> Result<Walk, ErofsError> {
    let root = stack.root()?;
    let mut seen = SeenMerged::new(stack);
    let mut w = Walk::default();
    // Per directory node, its merged parts (by node index).
    let mut merged: HashMap<u32, MergedDir> = HashMap::new();
    let mut links: HashMap<(usize, u32), u32> = HashMap::new();
    let (l, r) = root.parts[0];
    add_node(&stack.layers()[l], &mut w, &r, l as u32, 0)?;
    merged.insert(0, root);
    let mut i = 0;
    while i < w.nodes.len() {
        let Some(dir) = merged.remove(&(i as u32)) else {
            i += 1;
            continue;
        };
        seen.enter(stack, &dir)?;
        let first = w.entries.len() as u32;
        let mut subdirs = 0u32;
        for (name, found) in stack.children(&dir)? {
            if name.len() > NAME_MAX {
                return Err(unsupported(format!(
                    "a name of {} bytes (at most 255)",
                    name.len()
                )));
            }
            let name_at = w.names.len();
            w.names.extend_from_slice(&name);
            let node = match found {
                Found::Dir(d) => {
                    subdirs += 1;
                    let (l, di) = d.parts[0];
                    let n = add_node(&stack.layers()[l], &mut w, &di, l as u32, i as u32)?;
                    merged.insert(n, d);
                    n
                }
                Found::Node(l, kid) => {
                    let several = kid.rec.nlink > 1;
                    match several.then(|| links.get(&(l, kid.ino))).flatten() {
                        Some(&n) => n,
                        None => {
                            let n = add_node(&stack.layers()[l], &mut w, &kid, l as u32, i as u32)?;
                            if several {
                                links.insert((l, kid.ino), n);
                            }
                            n
                        }
                    }
                }
            };
            w.entries.push(Entry {
                name_at,
                name_len: name.len() as u8,
                node,
            });
        }
        w.close_dir(i, first);
        // A merged directory's links: its own two and one per subdirectory
        // of the merged view (no single layer's count is that).
        w.nodes[i].rec.nlink = 2 + subdirs;
        i += 1;
    }
    // A file's links: the names the merged view shows it by (a layer
    // above may have whited out some of those its own layer counts).
    let mut shown: HashMap<u32, u32> = links.values().map(|&n| (n, 0)).collect();
    for e in &w.entries {
        if let Some(c) = shown.get_mut(&e.node) {
            *c += 1;
        }
    }
    for (n, c) in shown {
        w.nodes[n as usize].rec.nlink = c;
    }
    Ok(w)
}

fn name<'a>(names: &'a [u8], e: &Entry) -> &'a [u8] {
    &names[e.name_at..e.name_at + e.name_len as usize]
}

fn add_node(
    img: &Image,
    w: &mut Walk,
    i: &Inode,
    layer: u32,
    parent: u32,
) -> Result<u32, ErofsError> {
    let at = w.xattrs.len();
    if i.rec.xattr != 0 {
        let set = img.xattrs(i)?;
        encode_xattrs(&set.0, &mut w.xattrs)?;
    }
    let n =
        u32::try_from(w.nodes.len()).map_err(|_| unsupported("more than 2^32 inodes".into()))?;
    w.nodes.push(Node {
        rec: i.rec,
        kids: (0, 0),
        parent,
        xattrs: (at as u32, (w.xattrs.len() - at) as u32),
        ino: i.ino,
        layer,
    });
    Ok(n)
}

/// EROFS's short name prefixes (`EROFS_XATTR_INDEX_*`): a name is stored
/// as a prefix index and the rest. The ACLs' names are whole.
const PREFIXES: [(&[u8], u8); 6] = [
    (b"user.", 1),
    (b"system.posix_acl_access", 2),
    (b"system.posix_acl_default", 3),
    (b"trusted.", 4),
    (b"lustre.", 5),
    (b"security.", 6),
];

/// Inline xattrs: a 12-byte header, then per attribute a 4-byte entry
/// header, the name's rest and the value, padded to 4 bytes.
fn encode_xattrs(set: &[(Vec<u8>, Vec<u8>)], out: &mut Vec<u8>) -> Result<(), ErofsError> {
    if set.is_empty() {
        return Ok(());
    }
    let start = out.len();
    out.extend_from_slice(&[0u8; 12]);
    for (k, v) in set {
        let Some((rest, index)) = PREFIXES
            .iter()
            .find_map(|(p, i)| k.strip_prefix(*p).map(|r| (r, *i)))
        else {
            return Err(unsupported(format!(
                "the extended attribute {}",
                String::from_utf8_lossy(k)
            )));
        };
        let (Ok(nlen), Ok(vlen)) = (u8::try_from(rest.len()), u16::try_from(v.len())) else {
            return Err(unsupported(format!(
                "the extended attribute {} of {} bytes",
                String::from_utf8_lossy(k),
                v.len()
            )));
        };
        out.push(nlen);
        out.push(index);
        out.extend_from_slice(&vlen.to_le_bytes());
        out.extend_from_slice(rest);
        out.extend_from_slice(v);
        out.resize(start + (out.len() - start).next_multiple_of(4), 0);
    }
    if (out.len() - start - 12) / 4 + 1 > u16::MAX as usize {
        return Err(unsupported("extended attributes past 256 KiB".into()));
    }
    Ok(())
}

/// Where every inode goes.
struct Plan {
    /// Per node: its byte offset (the nid is that over 32).
    at: Vec<u64>,
    /// Per node: the block of its full data blocks (directories past a
    /// block), or of its blob range (files with data); else 0.
    blk: Vec<u32>,
    /// Per node: a directory's size (its entries in EROFS blocks), else 0.
    dir_size: Vec<u64>,
    map: BlobMap,
    /// The time compact inodes take (the most common one).
    time: (i64, u32),
    /// Bytes in all.
    end: u64,
}

/// How one node is stored.
struct Shape {
    isize: u64,
    layout: u16,
    /// Bytes after the inode and its xattrs: a directory's last partial
    /// block or a link's target (inline), or chunk indexes.
    tail: u64,
    /// Full blocks of a directory's entries, stored apart.
    full: u64,
    /// A file's chunks: their size in bits, their number.
    chunk_bits: u32,
    chunks: u64,
}

fn lay_out(w: &Walk) -> Result<Plan, ErofsError> {
    let time = common_time(&w.nodes);
    let mut plan = Plan {
        at: Vec::with_capacity(w.nodes.len()),
        blk: Vec::with_capacity(w.nodes.len()),
        dir_size: Vec::with_capacity(w.nodes.len()),
        map: BlobMap::default(),
        time,
        end: 0,
    };
    let mut pos = FIRST_INODE;
    for (i, n) in w.nodes.iter().enumerate() {
        let dir_size = match n.rec.file_type() {
            Some(FileType::Directory) => dir_size(w, i),
            _ => 0,
        };
        plan.dir_size.push(dir_size);
        let s = shape(w, i, time, dir_size);
        let mut blk = 0;
        if s.full > 0 {
            pos = pos.next_multiple_of(BLOCK);
            blk = block_no(pos)?;
            pos += s.full * BLOCK;
        }
        if s.layout == CHUNK_BASED {
            blk = plan.map.push(n.layer, n.ino, n.rec.size).ok_or_else(|| {
                unsupported("more than 16 TiB of file data (32-bit block addresses)".into())
            })?;
        }
        let head = s.isize + u64::from(n.xattrs.1);
        // An inline tail must lie in the inode's block (the kernel refuses
        // one that crosses); the inode and its xattrs are kept in one too.
        let must_fit = if s.layout == FLAT_INLINE {
            head + s.tail
        } else {
            head
        };
        if must_fit > BLOCK {
            return Err(unsupported(
                "a link whose target and attributes pass one block".into(),
            ));
        }
        if pos % BLOCK + must_fit > BLOCK {
            pos = pos.next_multiple_of(BLOCK);
        }
        plan.at.push(pos);
        plan.blk.push(blk);
        pos = (pos + head + s.tail).next_multiple_of(32);
    }
    if plan.at[0] / 32 > u64::from(u16::MAX) {
        return Err(unsupported(
            "a root inode past the superblock's 16 bits".into(),
        ));
    }
    plan.end = pos.next_multiple_of(BLOCK);
    block_no(plan.end)?;
    Ok(plan)
}

fn block_no(pos: u64) -> Result<u32, ErofsError> {
    u32::try_from(pos / BLOCK)
        .ok()
        .filter(|&b| b != u32::MAX)
        .ok_or_else(|| unsupported("metadata past 16 TiB".into()))
}

/// The mtime most inodes have: compact inodes take it from the superblock.
fn common_time(nodes: &[Node]) -> (i64, u32) {
    let mut counts: HashMap<(i64, u32), u64> = HashMap::new();
    for n in nodes.iter().step_by((nodes.len() / 65536).max(1)) {
        *counts
            .entry((n.rec.mtime_sec, n.rec.mtime_nsec))
            .or_default() += 1;
    }
    counts
        .into_iter()
        .max_by_key(|&(t, c)| (c, std::cmp::Reverse(t)))
        .map_or((0, 0), |(t, _)| t)
}

fn compact(r: &InodeRecord, time: (i64, u32)) -> bool {
    time.0 >= 0
        && r.uid <= 0xffff
        && r.gid <= 0xffff
        && r.nlink <= 0xffff
        && r.size <= u64::from(u32::MAX)
        && (r.mtime_sec, r.mtime_nsec) == time
}

/// How node `i` is stored; `dir_size`: a directory's entries' size
/// ([`dir_size`], found once per directory by the layout).
fn shape(w: &Walk, i: usize, time: (i64, u32), dir_size: u64) -> Shape {
    let n = &w.nodes[i];
    let isize = if compact(&n.rec, time) {
        COMPACT
    } else {
        EXTENDED
    };
    let plain = Shape {
        isize,
        layout: FLAT_PLAIN,
        tail: 0,
        full: 0,
        chunk_bits: 0,
        chunks: 0,
    };
    match n.rec.file_type() {
        Some(FileType::Directory) => {
            let (full, tail) = (dir_size / BLOCK, dir_size % BLOCK);
            if tail == 0 {
                Shape { full, ..plain }
            } else if isize + u64::from(n.xattrs.1) + tail > BLOCK {
                // No room for the tail beside the inode: a block of its own.
                Shape {
                    full: full + 1,
                    ..plain
                }
            } else {
                Shape {
                    layout: FLAT_INLINE,
                    tail,
                    full,
                    ..plain
                }
            }
        }
        Some(FileType::Symlink) if n.rec.size > 0 => Shape {
            layout: FLAT_INLINE,
            tail: n.rec.size,
            ..plain
        },
        Some(FileType::Regular) if n.rec.size > 0 => {
            let blocks = n.rec.size.div_ceil(BLOCK);
            let bits = 12 + blocks.next_power_of_two().trailing_zeros();
            let chunk_bits = bits.min(MAX_CHUNK_BITS);
            let chunks = n.rec.size.div_ceil(1 << chunk_bits);
            Shape {
                layout: CHUNK_BASED,
                // Indexes start 8-aligned: inode and xattrs are multiples of 4,
                // the inode's place of 32.
                tail: (isize + u64::from(n.xattrs.1)).next_multiple_of(8)
                    - (isize + u64::from(n.xattrs.1))
                    + chunks * 8,
                chunk_bits,
                chunks,
                ..plain
            }
        }
        _ => plain,
    }
}

/// A directory's entries with `.` and `..`, in EROFS's order (bytes).
fn dir_list(w: &Walk, i: usize) -> Vec<(&[u8], u32)> {
    let n = &w.nodes[i];
    let mut v: Vec<(&[u8], u32)> = Vec::with_capacity((n.kids.1 - n.kids.0) as usize + 2);
    v.push((b".", i as u32));
    v.push((b"..", n.parent));
    for e in &w.entries[n.kids.0 as usize..n.kids.1 as usize] {
        v.push((name(&w.names, e), e.node));
    }
    v.sort_unstable_by(|a, b| a.0.cmp(b.0));
    v
}

/// How many entries go in each directory block: as many as fit, each
/// taking 12 bytes and its name.
fn dir_blocks(list: &[(&[u8], u32)]) -> Vec<usize> {
    let mut blocks = Vec::new();
    let (mut n, mut used) = (0usize, 0u64);
    for (name, _) in list {
        let need = DIRENT + name.len() as u64;
        if used + need > BLOCK {
            blocks.push(n);
            (n, used) = (0, 0);
        }
        n += 1;
        used += need;
    }
    blocks.push(n);
    blocks
}

fn dir_size(w: &Walk, i: usize) -> u64 {
    let list = dir_list(w, i);
    let blocks = dir_blocks(&list);
    let last = *blocks.last().expect("one block at least");
    let names: u64 = list[list.len() - last..]
        .iter()
        .map(|(n, _)| n.len() as u64)
        .sum();
    (blocks.len() as u64 - 1) * BLOCK + last as u64 * DIRENT + names
}

/// A writer that knows how far it is.
struct Counting<W: Write> {
    inner: W,
    at: u64,
}

impl<W: Write> Counting<W> {
    fn put(&mut self, b: &[u8]) -> io::Result<()> {
        self.inner.write_all(b)?;
        self.at += b.len() as u64;
        Ok(())
    }

    fn pad_to(&mut self, pos: u64) -> io::Result<()> {
        const ZEROS: [u8; 4096] = [0; 4096];
        if pos < self.at {
            return Err(io::Error::other("the EROFS layout went backwards"));
        }
        while self.at < pos {
            let n = (pos - self.at).min(ZEROS.len() as u64) as usize;
            self.put(&ZEROS[..n])?;
        }
        Ok(())
    }
}

fn file_type_code(t: Option<FileType>) -> u8 {
    match t {
        Some(FileType::Regular) => 1,
        Some(FileType::Directory) => 2,
        Some(FileType::CharDevice) => 3,
        Some(FileType::BlockDevice) => 4,
        Some(FileType::Fifo) => 5,
        Some(FileType::Socket) => 6,
        Some(FileType::Symlink) => 7,
        None => 0,
    }
}

fn emit<W: Write>(
    tree: Tree<'_>,
    w: &Walk,
    plan: &Plan,
    out: &mut Counting<W>,
) -> Result<(), ErofsError> {
    out.pad_to(SUPER_OFFSET)?;
    out.put(&superblock(w, plan))?;
    out.put(&device_slot(plan.map.blocks()))?;
    let mut buf = Vec::with_capacity(BLOCK as usize);
    for (i, n) in w.nodes.iter().enumerate() {
        let s = shape(w, i, plan.time, plan.dir_size[i]);
        let t = n.rec.file_type();
        let nid = |node: u32| plan.at[node as usize] / 32;
        buf.clear();
        let mut dir_tail = Vec::new();
        if t == Some(FileType::Directory) {
            let list = dir_list(w, i);
            let mut blocks = Vec::new();
            let mut from = 0;
            for count in dir_blocks(&list) {
                let mut b = Vec::with_capacity(BLOCK as usize);
                let part = &list[from..from + count];
                let mut nameoff = DIRENT * count as u64;
                for (name, node) in part {
                    b.extend_from_slice(&nid(*node).to_le_bytes());
                    b.extend_from_slice(&(nameoff as u16).to_le_bytes());
                    b.push(file_type_code(w.nodes[*node as usize].rec.file_type()));
                    b.push(0);
                    nameoff += name.len() as u64;
                }
                for (name, _) in part {
                    b.extend_from_slice(name);
                }
                blocks.push(b);
                from += count;
            }
            let last = blocks.pop().expect("one block at least");
            if s.full > 0 {
                out.pad_to(u64::from(plan.blk[i]) * BLOCK)?;
                for b in &blocks {
                    out.put(b)?;
                    out.pad_to(out.at.next_multiple_of(BLOCK))?;
                }
                if s.layout != FLAT_INLINE {
                    // The last partial block stored as a block of its own.
                    out.put(&last)?;
                    out.pad_to(out.at.next_multiple_of(BLOCK))?;
                }
            }
            if s.layout == FLAT_INLINE {
                dir_tail = last;
            }
        }
        let size = match t {
            Some(FileType::Directory) => plan.dir_size[i],
            Some(FileType::Regular | FileType::Symlink) => n.rec.size,
            _ => 0,
        };
        inode(&mut buf, n, &s, size, plan.blk[i], i as u32)?;
        buf.extend_from_slice(&w.xattrs[n.xattrs.0 as usize..(n.xattrs.0 + n.xattrs.1) as usize]);
        match s.layout {
            FLAT_INLINE if t == Some(FileType::Symlink) => {
                let target = tree.image(n.layer).read_link(&Inode {
                    ino: n.ino,
                    rec: n.rec,
                })?;
                if target.len() as u64 != n.rec.size {
                    return Err(unsupported("a link whose target is not its size".into()));
                }
                buf.extend_from_slice(&target);
            }
            FLAT_INLINE => buf.extend_from_slice(&dir_tail),
            CHUNK_BASED => {
                buf.resize(buf.len().next_multiple_of(8), 0);
                let per = 1u64 << (s.chunk_bits - 12);
                for c in 0..s.chunks {
                    buf.extend_from_slice(&0u16.to_le_bytes());
                    buf.extend_from_slice(&1u16.to_le_bytes());
                    let blk = u64::from(plan.blk[i]) + c * per;
                    buf.extend_from_slice(&(blk as u32).to_le_bytes());
                }
            }
            _ => {}
        }
        out.pad_to(plan.at[i])?;
        out.put(&buf)?;
    }
    out.pad_to(plan.end)?;
    Ok(())
}

/// One inode: compact (the superblock's time) or extended.
fn inode(
    buf: &mut Vec<u8>,
    n: &Node,
    s: &Shape,
    size: u64,
    blk: u32,
    serial: u32,
) -> Result<(), ErofsError> {
    let r = &n.rec;
    let xcount: u16 = if n.xattrs.1 == 0 {
        0
    } else {
        ((n.xattrs.1 - 12) / 4 + 1) as u16
    };
    let i_u: [u8; 4] = match r.file_type() {
        Some(FileType::CharDevice | FileType::BlockDevice) => rdev(r.data)?.to_le_bytes(),
        _ if s.layout == CHUNK_BASED => {
            let format = (s.chunk_bits - 12) as u16 | CHUNK_INDEXES;
            let mut b = [0u8; 4];
            b[..2].copy_from_slice(&format.to_le_bytes());
            b
        }
        _ => blk.to_le_bytes(),
    };
    let mode = u16::try_from(r.mode).map_err(|_| unsupported(format!("mode {:o}", r.mode)))?;
    if s.isize == COMPACT {
        let format = s.layout << 1;
        buf.extend_from_slice(&format.to_le_bytes());
        buf.extend_from_slice(&xcount.to_le_bytes());
        buf.extend_from_slice(&mode.to_le_bytes());
        buf.extend_from_slice(&(r.nlink as u16).to_le_bytes());
        buf.extend_from_slice(&(size as u32).to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
        buf.extend_from_slice(&i_u);
        buf.extend_from_slice(&serial.to_le_bytes());
        buf.extend_from_slice(&(r.uid as u16).to_le_bytes());
        buf.extend_from_slice(&(r.gid as u16).to_le_bytes());
        buf.extend_from_slice(&0u32.to_le_bytes());
    } else {
        let format = 1 | (s.layout << 1);
        buf.extend_from_slice(&format.to_le_bytes());
        buf.extend_from_slice(&xcount.to_le_bytes());
        buf.extend_from_slice(&mode.to_le_bytes());
        buf.extend_from_slice(&0u16.to_le_bytes());
        buf.extend_from_slice(&size.to_le_bytes());
        buf.extend_from_slice(&i_u);
        buf.extend_from_slice(&serial.to_le_bytes());
        buf.extend_from_slice(&r.uid.to_le_bytes());
        buf.extend_from_slice(&r.gid.to_le_bytes());
        // Two's complement: the kernel reads the field into a signed time.
        let sec = r.mtime_sec as u64;
        buf.extend_from_slice(&sec.to_le_bytes());
        buf.extend_from_slice(&r.mtime_nsec.to_le_bytes());
        buf.extend_from_slice(&r.nlink.to_le_bytes());
        buf.extend_from_slice(&[0u8; 16]);
    }
    Ok(())
}

/// A device number as the kernel's `new_encode_dev` stores it.
fn rdev(dev: u64) -> Result<u32, ErofsError> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    if major >= 1 << 12 || minor >= 1 << 20 {
        return Err(unsupported(format!("device {major}:{minor}")));
    }
    Ok((minor & 0xff) | (major << 8) | ((minor & !0xff) << 12))
}

fn superblock(w: &Walk, plan: &Plan) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
    // checksum (4..8) and compat features (8..12): none.
    b[12] = 12; // blkszbits
    b[14..16].copy_from_slice(&((plan.at[0] / 32) as u16).to_le_bytes());
    b[16..24].copy_from_slice(&(w.nodes.len() as u64).to_le_bytes());
    b[24..32].copy_from_slice(&(plan.time.0.max(0) as u64).to_le_bytes());
    b[32..36].copy_from_slice(&plan.time.1.to_le_bytes());
    b[36..40].copy_from_slice(&((plan.end / BLOCK) as u32).to_le_bytes());
    // meta_blkaddr (40..44) and xattr_blkaddr (44..48): 0.
    // uuid (48..64), volume name (64..80).
    b[64..69].copy_from_slice(b"sheaf");
    b[80..84].copy_from_slice(&(INCOMPAT_CHUNKED_FILE | INCOMPAT_DEVICE_TABLE).to_le_bytes());
    // u1 (84..86): 0.
    b[86..88].copy_from_slice(&1u16.to_le_bytes()); // extra_devices
    b[88..90].copy_from_slice(&DEVT_SLOTOFF.to_le_bytes());
    b
}

fn device_slot(blocks: u64) -> [u8; 128] {
    let mut b = [0u8; 128];
    b[..5].copy_from_slice(b"sheaf");
    b[64..68].copy_from_slice(&(blocks as u32).to_le_bytes());
    b
}
