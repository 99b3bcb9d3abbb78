//! `sheaf snapshotter`: serve containerd's snapshots API (parsing only;
//! `sheaf_snapshotter` decides).

use anyhow::{Context, Result};
use std::path::PathBuf;

const HELP: &str = "\
containerd configuration (/etc/containerd/config.toml, version 2):

  [proxy_plugins.sheaf]
    type = \"snapshot\"
    address = \"/run/sheaf/snapshotter.sock\"
  [plugins.\"io.containerd.grpc.v1.cri\".containerd]
    snapshotter = \"sheaf\"
    disable_snapshot_annotations = false   # CRI then labels layers with their digests

Layers are found in the --repo repositories that `sheaf import --publish`
writes (directories or URLs); a layer found there is mounted lazily (through
the node cache) and containerd downloads nothing for it. Other layers are
fetched and applied by containerd as usual and packed here. State is kept in
ROOT/state.json; a restart keeps running containers' mounts (each is a
`sheaf mount` process of its own) and remakes missing ones.

Prefetch: when a repository holds REPO/prefetch-sha256-MANIFEST.txt (the files
the image's containers read first, one path per line, as `sheaf mount -o
record=FILE` writes), each lazy layer's listed files are fetched into the node
cache in the background while containerd is still pulling.

Signatures: with `[signatures] require = true` in the site configuration (or
--require-signature --signers FILE), a repository layer is used lazily only if
its index carries a trusted signature (`sheaf sign REPO/layer-sha256-…`);
other layers take containerd's own path (fetched, checked by digest, applied),
and state.json counts them as refused_layers.

`sheaf snapshotter --systemd-unit` prints a unit for systemd (make install
writes it to /etc/systemd/system/sheaf-snapshotter.service).";

/// Arguments of `sheaf snapshotter`.
#[derive(clap::Args, Debug)]
#[command(after_long_help = HELP)]
pub struct SnapshotterArgs {
    /// The unix socket containerd's [proxy_plugins] entry names.
    #[arg(
        long,
        default_value = "/run/sheaf/snapshotter.sock",
        value_name = "PATH"
    )]
    socket: PathBuf,
    /// Where snapshots, their state and mount points are kept.
    #[arg(
        long,
        default_value = "/var/lib/sheaf/snapshotter",
        value_name = "DIR",
        value_hint = clap::ValueHint::DirPath
    )]
    root: PathBuf,
    /// A sheaf repository (directory or URL) holding imported layers. Repeatable.
    #[arg(long = "repo", value_name = "DIR|URL")]
    repos: Vec<String>,
    /// Print a systemd unit that runs this command, and exit.
    #[arg(long)]
    systemd_unit: bool,
    /// Serve containers' roots as a writable sheaf union process instead of
    /// kernel overlayfs over a read-only one (the default where the kernel
    /// has overlayfs; bench/overlay.sh compares them).
    #[arg(long)]
    no_overlay: bool,
    #[command(flatten)]
    policy: crate::util::PolicyArgs,
}

/// Run `sheaf snapshotter`.
pub fn run(a: SnapshotterArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let exe = crate::util::sheaf_exe().context("finding the sheaf executable")?;
    if a.systemd_unit {
        let mut repos: String = a.repos.iter().map(|r| format!(" --repo {r}")).collect();
        if a.policy.require_signature {
            repos.push_str(" --require-signature");
        }
        if let Some(s) = &a.policy.signers {
            repos.push_str(&format!(" --signers {}", s.display()));
        }
        if let Some(i) = &a.policy.identity {
            repos.push_str(&format!(" --identity {i}"));
        }
        println!(
            "[Unit]\nDescription=sheaf containerd snapshotter (lazy sheaf layers)\nBefore=containerd.service\n\n[Service]\nType=notify\nExecStart={} snapshotter --socket {} --root {}{repos}\nRestart=always\nKillMode=process\n\n[Install]\nWantedBy=multi-user.target",
            exe.display(),
            a.socket.display(),
            a.root.display()
        );
        return Ok(0);
    }
    // Warnings (a refused or unreadable layer, a failed prefetch) go to
    // stderr: the terminal, or the journal under systemd.
    sheaf_mount::logging::init(
        sheaf_mount::logging::Target::Stderr,
        "snapshotter: ".into(),
        false,
    );
    let cfg = sheaf_snapshotter::Config {
        root: a.root.clone(),
        repos: a.repos.clone(),
        sheaf: exe,
        policy: a.policy.load()?,
        remote: remote.config()?,
        remote_args: remote.to_args_without_routes(),
        mirrors: remote.mirrors.clone(),
        proxy: remote.proxy.clone(),
        fetch_args: remote.to_args(),
        overlay: !a.no_overlay && sheaf_snapshotter::overlay_available(),
    };
    sheaf_snapshotter::serve(cfg, &a.socket)
        .with_context(|| format!("snapshotter on {}", a.socket.display()))?;
    Ok(0)
}
