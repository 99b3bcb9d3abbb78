//! Build input from tar: hostile archives (sparse maps, GNU type `S` with
//! extension headers and PAX 1.0 `GNU.sparse.*`, deep and long paths, PAX
//! headers, hardlinks, duplicates) read by sheaf-build's tar reader with
//! small, bounded options. The first byte picks the mode: even, an archive
//! (`sheaf build FILE.tar`: compression detected, absolute paths stripped);
//! odd, an image layer (absolute paths refused). A build must end with an
//! image that opens or one error; nothing may panic, hang, or take memory or
//! time beyond the input's (holes cost nothing, docs/build.md "Limits on
//! input"). The built image's EROFS metadata (the kernel path) is written
//! too: it is a whole image or one refusal, block-aligned, and its blob map
//! gives every regular file with data one range of its size.
#![no_main]
use libfuzzer_sys::fuzz_target;
use sheaf_build::{build, BuildOptions, Input, Progress, TarStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

fn run(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out.sheaf");
    // Small blocks: hole skipping, packs and block cuts all show up in
    // inputs of a few KB; one thread, no dictionary, no reference window.
    let opts = BuildOptions {
        threads: 1,
        block_size: 4096,
        pack_size: 4096,
        dictionary: false,
        ref_window: 0,
        skip_errors: kind & 2 != 0,
        ..Default::default()
    };
    let input = if kind & 1 == 0 {
        let tar = dir.path().join("in.tar");
        std::fs::write(&tar, rest).expect("write input");
        Input::TarFile(tar)
    } else {
        Input::Layer(TarStream {
            name: "layer".into(),
            reader: Arc::new(Mutex::new(Box::new(std::io::Cursor::new(rest.to_vec())))),
        })
    };
    let cancel = AtomicBool::new(false);
    if build(&input, &out, &opts, Arc::new(Progress::default()), &cancel).is_ok() {
        let img = sheaf_read::open_path(&out).expect("a built image opens");
        // Every file reads to its end without error (holes as zeros).
        let mut todo = vec![img.resolve(b"").expect("root")];
        let mut buf = vec![0u8; 1 << 16];
        while let Some(d) = todo.pop() {
            for e in img.read_dir(&d, 0, usize::MAX).expect("list") {
                let ino = img.inode(e.ino).expect("inode");
                match ino.file_type() {
                    sheaf_format::FileType::Directory => todo.push(ino),
                    sheaf_format::FileType::Regular => {
                        // A spot read at the start, middle and end.
                        let size = ino.rec.size;
                        for off in [0, size / 2, size.saturating_sub(1)] {
                            img.read(&ino, off, &mut buf).expect("read");
                        }
                    }
                    _ => {}
                }
            }
        }
        let mut meta = Vec::new();
        if let Ok(w) = sheaf_erofs::write(&img, &mut meta) {
            assert_eq!(w.bytes, meta.len() as u64);
            assert_eq!(meta.len() % 4096, 0);
            for e in w.map.extents() {
                let ino = img.inode(e.ino).expect("a mapped inode");
                assert_eq!(ino.file_type(), sheaf_format::FileType::Regular);
                assert_eq!(ino.rec.size, e.size);
            }
        }
    }
}

fuzz_target!(|data: &[u8]| run(data));
