//! `sheaf du`: du(1)'s totals from the image itself (file or URL), no
//! mount, on the same walk as `sheaf find`.

use crate::util::RemoteArgs;
use anyhow::{Context, Result};
use sheaf_format::FileType;
use sheaf_read::{Inode, Order, Step};
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `sheaf du`.
#[derive(clap::Args, Debug)]
// `-h` is du's human-readable flag, as in du(1): help is `--help` only.
#[command(
    disable_help_flag = true,
    after_help = "Sizes are apparent: bytes of files and symlink targets, a hardlinked file \
counted once (directories' own sizes are not counted). --inodes counts entries instead, \
as du --inodes does: every file, directory and link, a hardlinked file once. --json gives \
both for each row.\n\nExamples:\n  sheaf du -s -h data.sheaf\n  sheaf du -d 1 img.sheaf /usr\n  \
sheaf du --inodes -d 1 hcp.sheaf /subjects   # where the millions of files are"
)]
pub struct DuArgs {
    /// The image (file or URL), or a stack of layers BASE,LAYER,... (its
    /// merged tree; later layers win).
    image: PathBuf,
    /// Where to start in the image.
    #[arg(default_value = "/")]
    path: String,
    /// Only the total of PATH (du(1) refuses it with -a or -d, so does this).
    #[arg(short, long, conflicts_with_all = ["all", "max_depth"])]
    summarize: bool,
    /// Print directories at most N levels below PATH.
    #[arg(short = 'd', long, value_name = "N")]
    max_depth: Option<usize>,
    /// Print files too, not only directories.
    #[arg(short, long)]
    all: bool,
    /// Count entries (inodes) instead of bytes.
    #[arg(long)]
    inodes: bool,
    /// Human-readable sizes and counts, as du -h prints them (1.3G, 246K;
    /// powers of 1024, rounded up), which sort -h orders.
    #[arg(short = 'h', long)]
    human_readable: bool,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

/// What `sheaf du` adds up under a directory.
#[derive(Debug, Default, Clone, Copy)]
struct Usage {
    bytes: u64,
    inodes: u64,
}

impl Usage {
    fn add(&mut self, o: Usage) {
        self.bytes += o.bytes;
        self.inodes += o.inodes;
    }
}

/// `sheaf du`.
pub fn du(a: DuArgs, remote: &RemoteArgs, io: &mut crate::Io<'_>) -> Result<i32> {
    let start = crate::find::start_path(&a.path);
    let show_depth = if a.summarize {
        0
    } else {
        a.max_depth.unwrap_or(usize::MAX)
    };
    // Directories open on the walk's path, with their totals so far.
    let mut open: Vec<(Vec<u8>, usize, Usage)> = Vec::new();
    let mut rows: Vec<(Vec<u8>, Usage)> = Vec::new();
    let mut linked = std::collections::HashSet::new();
    let close =
        |open: &mut Vec<(Vec<u8>, usize, Usage)>, rows: &mut Vec<(Vec<u8>, Usage)>, to: usize| {
            while open.last().is_some_and(|d| d.1 >= to) {
                let (p, depth, total) = open.pop().expect("checked");
                if let Some(parent) = open.last_mut() {
                    parent.2.add(total);
                }
                if depth <= show_depth {
                    rows.push((p, total));
                }
            }
        };
    // Each entry, from the layer it shows from (0 for one image).
    let mut visit = |p: &[u8], layer: usize, ino: &Inode, depth: usize| {
        close(&mut open, &mut rows, depth);
        let ft = ino.file_type();
        // A hardlinked file counts once, where the walk meets it first.
        let again =
            ft == FileType::Regular && ino.rec.nlink > 1 && !linked.insert((layer, ino.ino));
        let own = match ft {
            _ if again => Usage::default(),
            FileType::Regular | FileType::Symlink => Usage {
                bytes: ino.rec.size,
                inodes: 1,
            },
            _ => Usage {
                bytes: 0,
                inodes: 1,
            },
        };
        if ft == FileType::Directory {
            open.push((p.to_vec(), depth, own));
        } else {
            if let Some(d) = open.last_mut() {
                d.2.add(own);
            }
            // PATH names a file (its own row), or -a.
            if open.is_empty() || (a.all && depth <= show_depth && !again) {
                rows.push((p.to_vec(), own));
            }
        }
        Ok(Step::Continue)
    };
    // One image, or the merged tree of a stack BASE,LAYER,...
    let walked = match crate::util::stack_layers(&a.image) {
        Some(layers) => {
            let stack = crate::util::open_stack(&layers, remote)?;
            let found = stack.resolve(&start)?;
            stack.walk_in(Order::Pre, found, start, &mut |p, f, depth| {
                let (layer, ino) = f.shown();
                visit(p, layer, &ino, depth)
            })
        }
        None => {
            let img = crate::util::open_image(&a.image, remote)?;
            let ino = img.resolve(&start)?;
            img.walk(ino, start, &mut |p, ino, depth| visit(p, 0, ino, depth))
        }
    };
    walked.with_context(|| a.image.display().to_string())?;
    close(&mut open, &mut rows, 0);
    let tty = io.stdout_is_tty();
    let mut o = std::io::BufWriter::new(&mut *io.stdout);
    if a.json {
        let v: Vec<_> = rows
            .iter()
            .map(|(p, u)| {
                serde_json::json!({"path": String::from_utf8_lossy(p), "bytes": u.bytes, "inodes": u.inodes})
            })
            .collect();
        writeln!(o, "{}", serde_json::Value::Array(v))?;
    } else {
        for (p, u) in rows {
            let n = if a.inodes { u.inodes } else { u.bytes };
            let size = match a.human_readable {
                true => crate::util::human_size(n),
                false => n.to_string(),
            };
            write!(o, "{size}\t")?;
            // On a terminal quoted as ls does (an image's names may hold
            // escape sequences); raw into a pipe.
            match tty {
                true => o.write_all(crate::util::terminal_name(&p).as_bytes())?,
                false => o.write_all(&p)?,
            }
            o.write_all(b"\n")?;
        }
    }
    o.flush()?;
    Ok(0)
}
