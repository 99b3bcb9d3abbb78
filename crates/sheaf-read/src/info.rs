//! What an image says about itself: the fields of `sheaf info --json`, in
//! one place for the CLI and the Python package.

use crate::error::ReadError;
use crate::image::Image;
use sheaf_format::layers::{parse, Name};
use sheaf_format::{hex, FileType, StreamId};

/// Paths hidden by whiteouts in `img`, and its opaque directories, sorted.
pub fn whiteouts(img: &Image) -> Result<(Vec<String>, Vec<String>), ReadError> {
    let (mut wh, mut opaque) = (Vec::new(), Vec::new());
    let mut todo = vec![(img.root()?, Vec::<u8>::new())];
    let mut seen = crate::Seen::new(img);
    while let Some((dir, prefix)) = todo.pop() {
        seen.enter(img, &dir)?;
        let n = img.dir_len(&dir)?;
        for e in img.read_dir(&dir, 0, n as usize)? {
            let full = join_name(&prefix, &e.name);
            match parse(&e.name) {
                Name::Opaque => opaque.push(
                    String::from_utf8_lossy(if prefix.is_empty() { b"/" } else { &prefix })
                        .into_owned(),
                ),
                Name::Whiteout(t) => {
                    wh.push(String::from_utf8_lossy(&join_name(&prefix, t)).into_owned())
                }
                Name::Plain(_) if e.file_type == FileType::Directory => {
                    todo.push((img.child(&dir, e.ino, e.file_type)?, full));
                }
                Name::Plain(_) => {}
            }
        }
    }
    wh.sort();
    opaque.sort();
    Ok((wh, opaque))
}

/// `prefix/name`, or `name` when `prefix` is empty: a path below a start.
pub fn join_name(prefix: &[u8], name: &[u8]) -> Vec<u8> {
    let mut full = prefix.to_vec();
    if !full.is_empty() {
        full.push(b'/');
    }
    full.extend_from_slice(name);
    full
}

/// The fields of `sheaf info --json` for `img`, named `name` (as the user
/// gave it). `whiteouts`: the result of [`whiteouts`] when the caller wants
/// them listed (else those fields are null). `signature` describes one
/// stored signature (algorithm, key, namespace; this crate does not parse
/// signatures: `sheaf_trust::describe` does).
pub fn info(
    img: &Image,
    name: &str,
    whiteouts: Option<&(Vec<String>, Vec<String>)>,
    signature: &dyn Fn(&[u8]) -> serde_json::Value,
) -> Result<serde_json::Value, ReadError> {
    let sb = img.superblock();
    let build: serde_json::Value = img
        .build_info()?
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_default();
    let stats = &build["stats"];
    let meta_bytes: u64 = StreamId::ALL.iter().map(|&id| sb.stream(id).len).sum();
    Ok(serde_json::json!({
        "image": name,
        "image_bytes": img.len(),
        "root_digest": hex(&img.root_digest()),
        "inodes": sb.inode_count,
        "entries_by_type": stats["entries_by_type"],
        "hardlinked_inodes": stats["hardlinked_inodes"],
        "logical_bytes": sb.logical_bytes,
        "stored_data_bytes": sb.stored_data_bytes,
        "compression_ratio": sb.logical_bytes as f64 / img.len().max(1) as f64,
        "dedup_bytes": stats["dedup_bytes"],
        "hole_bytes": stats["hole_bytes"],
        "blocks": sb.block_count,
        "blocks_by_codec": stats["blocks_by_codec"],
        "block_size": sb.block_size,
        "page_size": sb.page_size,
        "metadata_bytes_uncompressed": meta_bytes,
        "build": {
            "builder": build["builder"],
            "compression": build["compression"],
            "owner": build["owner"],
            "mtime": build["mtime"],
            "clamp_mtime": build["clamp_mtime"],
            "exclude": build["exclude"],
        },
        "signatures": img.signatures().iter().map(|s| signature(s)).collect::<Vec<_>>(),
        "prefetch_blocks": img.prefetch_list()?.len(),
        "whiteouts": whiteouts.map(|w| &w.0),
        "opaque_dirs": whiteouts.map(|w| &w.1),
        "sections": img.sections().iter().map(|s| serde_json::json!({
            "kind": s.kind.id(), "required": s.required(), "offset": s.offset, "length": s.length,
        })).collect::<Vec<_>>(),
    }))
}
