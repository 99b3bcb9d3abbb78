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
    #[arg(long, default_value = "/var/lib/sheaf/snapshotter", value_name = "DIR")]
    root: PathBuf,
    /// A sheaf repository (directory or URL) holding imported layers. Repeatable.
    #[arg(long = "repo", value_name = "DIR|URL")]
    repos: Vec<String>,
    /// Print a systemd unit that runs this command, and exit.
    #[arg(long)]
    systemd_unit: bool,
}

/// Run `sheaf snapshotter`.
pub fn run(a: SnapshotterArgs) -> Result<i32> {
    let exe = std::env::current_exe().context("finding the sheaf executable")?;
    if a.systemd_unit {
        let repos: String = a.repos.iter().map(|r| format!(" --repo {r}")).collect();
        println!(
            "[Unit]\nDescription=sheaf containerd snapshotter (lazy sheaf layers)\nBefore=containerd.service\n\n[Service]\nExecStart={} snapshotter --socket {} --root {}{repos}\nRestart=always\nKillMode=process\n\n[Install]\nWantedBy=multi-user.target",
            exe.display(),
            a.socket.display(),
            a.root.display()
        );
        return Ok(0);
    }
    let cfg = sheaf_snapshotter::Config {
        root: a.root.clone(),
        repos: a.repos.clone(),
        sheaf: exe,
    };
    sheaf_snapshotter::serve(cfg, &a.socket)
        .with_context(|| format!("snapshotter on {}", a.socket.display()))?;
    Ok(0)
}
