//! Write the EROFS metadata of an image (and, with a third argument, the
//! blob as a plain file): for benchmarks and for looking at what the
//! kernel is given. `erofs-meta IMAGE META [BLOB]`.

use sheaf_read::{FileSource, Image};
use std::io::Write;
use std::sync::Arc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: erofs-meta IMAGE META [BLOB]");
        std::process::exit(2);
    }
    let img = Image::open(Arc::new(FileSource::open(std::path::Path::new(&args[1]))?))?;
    let t = std::time::Instant::now();
    let mut out = std::fs::File::create(&args[2])?;
    let w = sheaf_erofs::write(&img, &mut out)?;
    let secs = t.elapsed().as_secs_f64();
    eprintln!(
        "{} inodes, {} entries, {} bytes ({:.1} B/entry), {:.3} s ({:.0} entries/s), blob {} blocks",
        w.inodes,
        w.entries,
        w.bytes,
        w.bytes as f64 / w.inodes.max(1) as f64,
        secs,
        w.inodes as f64 / secs,
        w.map.blocks()
    );
    if let Some(blob) = args.get(3) {
        let mut f = std::io::BufWriter::new(std::fs::File::create(blob)?);
        let mut at = 0u64;
        for e in w.map.extents() {
            let ino = img.inode(e.ino)?;
            let mut buf = vec![0u8; (e.blocks() * sheaf_erofs::BLOCK) as usize];
            let mut off = 0;
            while off < e.size as usize {
                let n = img.read(&ino, off as u64, &mut buf[off..e.size as usize])?;
                if n == 0 {
                    break;
                }
                off += n;
            }
            assert_eq!(at, u64::from(e.start) * sheaf_erofs::BLOCK);
            f.write_all(&buf)?;
            at += buf.len() as u64;
        }
        f.flush()?;
    }
    Ok(())
}
