//! Full verification of an image: every metadata page and data block is
//! read, decompressed and checked against its hash, every inode decoded,
//! and the tree walked once against the rules of format.md §8.5.

use crate::error::ReadError;
use crate::image::Image;
use crate::tree::Seen;
use rayon::prelude::*;
use sheaf_format::FileType;
use sheaf_format::StreamId;
use std::sync::atomic::{AtomicU64, Ordering};

/// Result of [`verify`].
#[derive(Debug, Default, Clone)]
pub struct VerifyReport {
    /// Metadata pages checked.
    pub pages: u64,
    /// Data blocks checked.
    pub blocks: u64,
    /// Inodes decoded.
    pub inodes: u64,
    /// Entries reached by the tree walk (the root included).
    pub entries: u64,
    /// Uncompressed bytes of data blocks checked.
    pub block_bytes: u64,
    /// Problems found, one line each.
    pub errors: Vec<String>,
    /// Data blocks that failed their check.
    pub bad_blocks: Vec<u32>,
    /// The files whose data lies in a bad block (paths from the root, at
    /// most [`MAX_DAMAGED_FILES`]): what a user loses.
    pub damaged_files: Vec<String>,
}

/// Most damaged files [`verify`] names.
pub const MAX_DAMAGED_FILES: usize = 1000;

/// Verify everything; `progress` counts checked uncompressed bytes. Uses the
/// current rayon pool. Stops listing after 100 errors.
pub fn verify(img: &Image, progress: &AtomicU64) -> VerifyReport {
    let mut rep = VerifyReport::default();
    let push = |rep: &mut VerifyReport, e: String| {
        if rep.errors.len() < 100 {
            rep.errors.push(e);
        }
    };
    for s in img.sections() {
        if let Err(e) = img.check_section(s) {
            push(&mut rep, e.to_string());
        }
    }
    // Pages: every level of every stream, top down, so a bad ref is caught
    // where it is stored.
    for id in StreamId::ALL {
        for level in (0..img.stream_levels(id)).rev() {
            let n = img.page_count(id, level);
            let errs: Vec<String> = (0..n)
                .into_par_iter()
                .filter_map(|i| img.page(id, level, i).err().map(|e| e.to_string()))
                .collect();
            rep.pages += n;
            for e in errs {
                push(&mut rep, e);
            }
        }
    }
    let sb = img.superblock();
    let block_count = sb.block_count as u32;
    let (bytes, errs): (u64, Vec<(u32, String)>) = (0..block_count)
        .into_par_iter()
        .map(|id| {
            let r = img.block_ref(id).and_then(|r| {
                let what = || format!("data block {id}");
                img.load_ref(&r, sb.block_size, &what)
                    .map(|d| d.len() as u64)
            });
            match r {
                Ok(n) => {
                    progress.fetch_add(n, Ordering::Relaxed);
                    (n, vec![])
                }
                Err(e) => (0, vec![(id, e.to_string())]),
            }
        })
        .reduce(|| (0, vec![]), |a, b| (a.0 + b.0, [a.1, b.1].concat()));
    rep.blocks = block_count as u64;
    rep.block_bytes = bytes;
    for (id, e) in errs {
        rep.bad_blocks.push(id);
        push(&mut rep, e);
    }
    rep.bad_blocks.sort_unstable();
    if !rep.bad_blocks.is_empty() {
        rep.damaged_files = files_in_blocks(img, &rep.bad_blocks);
    }
    let errs: Vec<String> = (0..sb.inode_count as u32)
        .into_par_iter()
        .filter_map(|i| img.inode(i).err().map(|e| e.to_string()))
        .collect();
    rep.inodes = sb.inode_count;
    for e in errs {
        push(&mut rep, e);
    }
    match walk_tree(img) {
        Ok(n) => rep.entries = n,
        Err(e) => push(&mut rep, e.to_string()),
    }
    rep
}

/// The paths of the regular files with data in `blocks` (sorted), in walk
/// order, at most [`MAX_DAMAGED_FILES`]; a walk the damage cuts short
/// names what it reached.
pub fn files_in_blocks(img: &Image, blocks: &[u32]) -> Vec<String> {
    let mut out = Vec::new();
    let Ok(root) = img.root() else {
        return out;
    };
    let _ = img.walk(root, b"/".to_vec(), &mut |path, ino, _| {
        if ino.file_type() == FileType::Regular {
            if let Ok(bs) = img.file_blocks(ino) {
                if bs.iter().any(|b| blocks.binary_search(b).is_ok()) {
                    out.push(String::from_utf8_lossy(path).into_owned());
                }
            }
        }
        Ok(if out.len() >= MAX_DAMAGED_FILES {
            crate::Step::Stop
        } else {
            crate::Step::Continue
        })
    });
    out
}

/// The paths (from the root) of the inodes `inos`, for those a walk from
/// the root reaches; stops once each has one.
pub fn paths_of(img: &Image, inos: &[u32]) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = Vec::new();
    let Ok(root) = img.root() else {
        return out;
    };
    if inos.contains(&root.ino) {
        out.push((root.ino, "/".into()));
    }
    let mut left: std::collections::HashSet<u32> = inos.iter().copied().collect();
    left.remove(&root.ino);
    let _ = img.walk(root, b"/".to_vec(), &mut |path, ino, _| {
        if left.remove(&ino.ino) {
            out.push((ino.ino, String::from_utf8_lossy(path).into_owned()));
        }
        Ok(if left.is_empty() {
            crate::Step::Stop
        } else {
            crate::Step::Continue
        })
    });
    out
}

/// Walk the whole tree from the root, each directory once, checking every
/// entry against the tree rules; the number of entries reached.
pub fn walk_tree(img: &Image) -> Result<u64, ReadError> {
    let mut seen = Seen::new(img);
    let mut todo = vec![img.root()?];
    let mut entries = 1;
    while let Some(dir) = todo.pop() {
        seen.enter(img, &dir)?;
        let n = img.dir_len(&dir)?;
        let mut from = 0;
        while from < n {
            let batch = img.read_dir(&dir, from, 4096)?;
            from += batch.len() as u64;
            let inos: Vec<u32> = batch.iter().map(|e| e.ino).collect();
            for (e, i) in batch.iter().zip(img.inodes(&inos)?) {
                img.check_child(&dir, &i, e.file_type)?;
                if e.file_type == FileType::Directory {
                    todo.push(i);
                }
            }
            entries += batch.len() as u64;
        }
    }
    Ok(entries)
}
