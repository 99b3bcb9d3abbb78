//! `sheaf bcast`: arguments, choosing the world (MPI or this process), and
//! printing; the broadcast itself is `sheaf_bcast`.

use crate::util::{human, parse_size64, PolicyArgs, RemoteArgs};
use anyhow::{bail, Result};
use sheaf_bcast::{Comm, Options, Report, Solo};
use std::io::IsTerminal;
use std::path::PathBuf;

/// Arguments of `sheaf bcast`.
#[derive(clap::Args, Debug)]
#[command(after_help = "\
Examples:
  # in a batch script: one copy per node, read from shared storage once
  mpirun --map-by ppr:1:node sheaf bcast /shared/pools/py-2.1.sheaf /tmp/pools/py-2.1.sheaf
  srun --ntasks-per-node=1 sheaf bcast https://repo.example/pools/py-2.1 /tmp/pools/py-2.1.sheaf
  # without a launcher: a verified local copy, with the same skip and delta rules
  sheaf bcast /shared/pools/py-2.1.sheaf /tmp/pools/py-2.1.sheaf

A node whose DEST already is this image (same root digest) does nothing. A node
holding an earlier version, or other images in DEST's directory, or objects in
its node cache, receives only the objects it lacks. DEST appears (atomic rename)
only when complete and verified on every node; on any failure every rank prints
the same one-line error and exits 1, and no DEST is touched.")]
pub struct BcastArgs {
    /// The image: a path on shared storage or a URL.
    src: PathBuf,
    /// The node-local destination path (the same on every node).
    dest: PathBuf,
    /// Bytes per broadcast message.
    #[arg(long, value_name = "SIZE", default_value = "16M", value_parser = parse_size64)]
    chunk: u64,
    /// Chunks each rank reads ahead of the broadcast (bounds memory:
    /// about 3 x WINDOW x CHUNK per rank).
    #[arg(long, value_name = "N", default_value_t = sheaf_bcast::DEFAULT_WINDOW)]
    window: usize,
    /// Also take objects from these local images (files or directories),
    /// besides DEST's directory and the node cache.
    #[arg(long, value_name = "PATH")]
    reuse: Vec<PathBuf>,
    /// Use MPI: auto (when started by mpirun/srun), always, or never (a
    /// local copy, even under a launcher).
    #[arg(long, value_name = "WHEN", default_value = "auto", value_parser = ["auto", "always", "never"])]
    mpi: String,
    /// Print the report as JSON on stdout (rank 0).
    #[arg(long)]
    json: bool,
    #[command(flatten)]
    policy: PolicyArgs,
}

/// Whether `--mpi WHEN` means this process is one rank of a job.
pub fn wants_mpi(when: &str) -> bool {
    match when {
        "always" => true,
        "never" => false,
        _ => sheaf_bcast::launched_by_mpi(),
    }
}

/// The world this process is part of.
fn world(when: &str) -> Result<Box<dyn Comm>> {
    if !wants_mpi(when) {
        return Ok(Box::new(Solo));
    }
    #[cfg(feature = "mpi")]
    {
        match sheaf_bcast::mpi::Mpi::init() {
            Some(m) => Ok(Box::new(m)),
            None => bail!("MPI could not be initialised"),
        }
    }
    #[cfg(not(feature = "mpi"))]
    bail!(
        "this sheaf was built without MPI support, so it cannot broadcast under a launcher \
         (rebuild with `make build` where mpicc is installed, see README; \
         or use --mpi never for a local copy on each node)"
    )
}

/// `sheaf bcast`.
pub fn run(a: BcastArgs, remote: &RemoteArgs) -> Result<i32> {
    let comm = world(&a.mpi)?;
    let mut o = Options::new(a.src.clone(), a.dest.clone());
    o.remote = remote.config()?;
    o.policy = a.policy.load()?;
    o.chunk = usize::try_from(a.chunk).unwrap_or(usize::MAX).max(64 << 10);
    o.window = a.window.max(1);
    o.reuse = a.reuse.clone();
    let rank = comm.rank();
    let bar = (rank == 0 && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{spinner} [{elapsed_precise}] {bar:30} {bytes}/{total_bytes} sent ({binary_bytes_per_sec}, ETA {eta})",
            )
            .expect("valid template"),
        );
        b
    });
    let progress = |done: u64, total: u64| {
        if let Some(b) = &bar {
            b.set_length(total);
            b.set_position(done);
        }
    };
    let r = sheaf_bcast::run(&*comm, &o, &progress);
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    let r = match r {
        Ok(r) => r,
        Err(e) => {
            // Every rank prints the agreed line before any exits: a launcher
            // kills the remaining ranks as soon as one exits non-zero.
            // One write, so the lines of ranks sharing a pipe do not mix.
            use std::io::Write;
            let line = sheaf_net::redact_text(&e.to_string());
            let _ = std::io::stderr().write_all(format!("sheaf: error: {line}\n").as_bytes());
            comm.all_max(0);
            drop(comm);
            std::process::exit(1);
        }
    };
    if rank == 0 {
        print(&a, &r)?;
    }
    Ok(0)
}

fn print(a: &BcastArgs, r: &Report) -> Result<()> {
    let src = sheaf_net::redact(&a.src.to_string_lossy());
    if a.json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    let nodes = if r.nodes == 1 {
        "1 node".to_string()
    } else {
        format!("{} nodes", r.nodes)
    };
    if r.nodes_present == r.nodes as u64 {
        eprintln!(
            "{} is already at {} on {nodes} (root {}); read {}",
            src,
            a.dest.display(),
            &r.root[..16],
            human(r.bytes_read)
        );
        return Ok(());
    }
    eprintln!(
        "{} -> {} on {nodes} ({} ranks) in {:.2} s: sent {} of {} ({} objects of {}); \
         read {} from the source; {} reused from local copies; {} node(s) already had it",
        src,
        a.dest.display(),
        r.ranks,
        r.seconds,
        human(r.bytes_sent),
        human(r.image_bytes),
        r.objects_sent,
        r.objects,
        human(r.bytes_read),
        human(r.bytes_reused),
        r.nodes_present
    );
    Ok(())
}
