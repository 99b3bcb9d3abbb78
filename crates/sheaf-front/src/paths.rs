//! Lists of paths inside an image (as `-o record=` writes them) and the
//! data blocks they name.

use std::path::Path;

/// A list of paths inside an image, one per line (as `-o record=` writes):
/// leading `/` and `./` are dropped, empty lines skipped.
pub fn read_path_list(f: &Path) -> anyhow::Result<Vec<Vec<u8>>> {
    let text = std::fs::read(f).map_err(|e| anyhow::anyhow!("{}: {e}", f.display()))?;
    Ok(text
        .split(|&b| b == b'\n')
        .map(|l| {
            let mut l = l.strip_suffix(b"\r").unwrap_or(l);
            loop {
                if let Some(r) = l.strip_prefix(b"/") {
                    l = r;
                } else if let Some(r) = l.strip_prefix(b"./") {
                    l = r;
                } else {
                    break l.to_vec();
                }
            }
        })
        .filter(|l| !l.is_empty())
        .collect())
}

/// The data blocks of the files listed in `list` (one path per line, as
/// `-o record=` writes), in order, each once; unknown paths are skipped.
pub fn prefetch_blocks(img: &sheaf_read::Image, list: &Path) -> anyhow::Result<Vec<u32>> {
    let mut seen = std::collections::HashSet::new();
    let mut blocks = Vec::new();
    for path in read_path_list(list)? {
        let Ok(ino) = img.resolve(&path) else {
            continue;
        };
        if ino.file_type() == sheaf_format::FileType::Regular {
            for b in img.file_blocks(&ino)? {
                if seen.insert(b) {
                    blocks.push(b);
                }
            }
        }
    }
    Ok(blocks)
}
