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

Restarts: containerd must never find the socket closed (its client backs off
for about a second after a refused dial). Under systemd, socket activation
keeps it open: `--systemd-socket` prints the .socket unit, `--systemd-unit`
the service (every flag given with it is kept in ExecStart; make install
writes both to /etc/systemd/system/). `systemctl restart` then queues
requests in the socket instead of refusing them. Without systemd, SIGHUP
(`systemctl reload`) finishes the requests being answered and executes the
snapshotter again in place, same pid, keeping the socket and the mounts.

Logs go to stderr (the journal under systemd) in containerd's style,
`time=\"…\" level=info msg=\"…\"` (--log-format json for JSON lines): one
line per decision (a layer lazy or applied, a mount made again, a removal);
--log-level debug adds every container root handed to containerd.";

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
    /// Print a systemd service unit that runs this command with the flags
    /// given with it, and exit.
    #[arg(long, conflicts_with = "systemd_socket")]
    systemd_unit: bool,
    /// Print the systemd socket unit that listens on --socket for the
    /// service (socket activation: restarts refuse no request), and exit.
    #[arg(long)]
    systemd_socket: bool,
    /// The lowest level logged: error, warn, info or debug (container
    /// roots handed to containerd).
    #[arg(long, default_value = "info", value_name = "LEVEL", value_parser = ["error", "warn", "info", "debug", "trace"])]
    log_level: String,
    /// Serve the counters (layers lazy, applied, refused; remounts;
    /// removals; snapshots) in Prometheus's text format at
    /// http://ADDR/metrics, e.g. 127.0.0.1:9877.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<std::net::SocketAddr>,
    /// Log lines as containerd writes its own (text: time=… level=…
    /// msg=…) or one JSON object per line.
    #[arg(long, default_value = "text", value_name = "FORMAT", value_parser = ["text", "json"])]
    log_format: String,
    /// Serve containers' roots as a writable sheaf union process instead of
    /// kernel overlayfs over a read-only one (the default where the kernel
    /// has overlayfs; bench/overlay.sh compares them).
    #[arg(long)]
    no_overlay: bool,
    #[command(flatten)]
    policy: crate::util::PolicyArgs,
}

/// A word of a systemd command line: quoted when it holds a space, a
/// quote, a backslash or a `%` / `$` systemd would expand.
fn unit_word(w: &str) -> String {
    if !w.is_empty()
        && !w
            .chars()
            .any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | '%' | '$' | ';'))
    {
        return w.to_string();
    }
    let mut q = String::from("\"");
    for c in w.chars() {
        match c {
            '"' | '\\' => {
                q.push('\\');
                q.push(c);
            }
            '%' => q.push_str("%%"),
            '$' => q.push_str("$$"),
            _ => q.push(c),
        }
    }
    q.push('"');
    q
}

/// The service unit: ExecStart keeps every flag given with --systemd-unit.
fn service_unit(
    a: &SnapshotterArgs,
    remote: &crate::util::RemoteArgs,
    exe: &std::path::Path,
) -> Result<String> {
    let secret = remote
        .mirrors
        .iter()
        .chain(remote.proxy.iter())
        .any(|u| sheaf_net::redact_text(u) != *u);
    if secret {
        anyhow::bail!(
            "--systemd-unit: a --mirror or --proxy holding a password or token would be written \
             into a unit every user can read; put it in /etc/sheaf/config.toml or an \
             EnvironmentFile= (SHEAF_PROXY) readable by root only"
        );
    }
    let mut argv: Vec<String> = vec![
        exe.display().to_string(),
        "snapshotter".into(),
        format!("--socket={}", a.socket.display()),
        format!("--root={}", a.root.display()),
    ];
    argv.extend(a.repos.iter().map(|r| format!("--repo={r}")));
    if a.no_overlay {
        argv.push("--no-overlay".into());
    }
    if let Some(m) = a.metrics {
        argv.push(format!("--metrics={m}"));
    }
    if a.policy.require_signature {
        argv.push("--require-signature".into());
    }
    if let Some(s) = &a.policy.signers {
        argv.push(format!("--signers={}", s.display()));
    }
    if let Some(i) = &a.policy.identity {
        argv.push(format!("--identity={i}"));
    }
    argv.extend(remote.to_args());
    argv.push(format!("--log-level={}", a.log_level));
    argv.push(format!("--log-format={}", a.log_format));
    let exec: Vec<String> = argv.iter().map(|w| unit_word(w)).collect();
    Ok(format!(
        "[Unit]
Description=sheaf containerd snapshotter (lazy sheaf layers)
Documentation=man:sheaf-snapshotter(1)
Requires=sheaf-snapshotter.socket
After=sheaf-snapshotter.socket
Before=containerd.service

[Service]
Type=notify
ExecStart={}
# systemctl reload: finish the requests being answered, execute again in place.
ExecReload=/bin/kill -HUP $MAINPID
Restart=always
# Each container's layers are served by a `sheaf mount` process of its own:
# stopping or restarting the snapshotter must not kill them.
KillMode=process

[Install]
WantedBy=multi-user.target
",
        exec.join(" ")
    ))
}

/// The socket unit: systemd holds --socket across the service's restarts.
fn socket_unit(a: &SnapshotterArgs) -> String {
    format!(
        "[Unit]
Description=sheaf containerd snapshotter socket
Before=containerd.service

[Socket]
ListenStream={}
SocketMode=0600
DirectoryMode=0755

[Install]
WantedBy=sockets.target
",
        a.socket.display()
    )
}

/// Run `sheaf snapshotter`.
pub fn run(a: SnapshotterArgs, remote: &crate::util::RemoteArgs) -> Result<i32> {
    let exe = crate::util::sheaf_exe().context("finding the sheaf executable")?;
    if a.systemd_unit {
        print!("{}", service_unit(&a, remote, &exe)?);
        return Ok(0);
    }
    if a.systemd_socket {
        print!("{}", socket_unit(&a));
        return Ok(0);
    }
    // Decisions (a layer lazy or applied, a refused or unreadable layer, a
    // failed prefetch) go to stderr: the terminal, or the journal under
    // systemd, in containerd's own line format.
    let level = a
        .log_level
        .parse::<log::LevelFilter>()
        .map_err(|_| anyhow::anyhow!("--log-level {}: not a level", a.log_level))?;
    let format = a
        .log_format
        .parse::<sheaf_mount::logging::Format>()
        .map_err(|e| anyhow::anyhow!("--log-format {e}"))?;
    sheaf_mount::logging::init_with(
        sheaf_mount::logging::Target::Stderr,
        String::new(),
        level,
        format,
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
        metrics: a.metrics,
    };
    sheaf_snapshotter::serve(cfg, &a.socket)
        .with_context(|| format!("snapshotter on {}", a.socket.display()))?;
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::unit_word;

    #[test]
    fn unit_words_are_quoted_as_systemd_reads_them() {
        assert_eq!(unit_word("--repo=/srv/sheaf"), "--repo=/srv/sheaf");
        assert_eq!(
            unit_word("--root=/var/lib/my dir"),
            "\"--root=/var/lib/my dir\""
        );
        assert_eq!(unit_word("a%b$c\"d"), "\"a%%b$$c\\\"d\"");
        assert_eq!(unit_word(""), "\"\"");
    }
}
