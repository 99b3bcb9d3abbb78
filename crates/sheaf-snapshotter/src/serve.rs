//! Serving containerd on the listening socket: readiness for systemd, the
//! signals (SIGTERM/SIGINT stop, SIGHUP restarts in place), the metrics.

use crate::Config;
use crate::{listen, metrics, snapshots, tonic, SheafSnapshotter};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Tell systemd the service is ready, when it asked (`$NOTIFY_SOCKET`).
fn notify_ready() {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sock = match std::os::unix::net::UnixDatagram::unbound() {
        Ok(s) => s,
        Err(e) => return log::warn!("NOTIFY_SOCKET: {e}"),
    };
    let sent = match path.as_encoded_bytes().strip_prefix(b"@") {
        // An abstract socket name.
        Some(name) => {
            use std::os::linux::net::SocketAddrExt;
            std::os::unix::net::SocketAddr::from_abstract_name(name)
                .and_then(|a| sock.send_to_addr(b"READY=1", &a))
        }
        None => sock.send_to(b"READY=1", &path),
    };
    if let Err(e) = sent {
        log::warn!("NOTIFY_SOCKET: {e}");
    }
}

/// How a run of [`serve`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stop {
    /// SIGTERM or SIGINT: exit.
    Exit,
    /// SIGHUP: execute again in place, keeping the socket.
    Restart,
}

/// Serve on the unix socket `socket` until SIGTERM or SIGINT; on SIGHUP,
/// finish the requests being answered and execute again in place with
/// the socket kept open ([`listen`]).
///
/// The socket is the one systemd handed over (socket activation) when
/// there is one, else `socket` is bound. It listens before the state is
/// opened and the snapshots' mounts are made again, so a client that
/// connects during a restart waits in the backlog instead of being
/// refused; systemd is told the service is ready (`READY=1` on
/// `$NOTIFY_SOCKET`, for `Type=notify`) once requests are answered.
pub fn serve(cfg: Config, socket: &Path) -> std::io::Result<()> {
    let listener = match listen::inherited().map_err(std::io::Error::other)? {
        Some(l) => {
            let name = l
                .local_addr()
                .ok()
                .and_then(|a| a.as_pathname().map(|p| p.display().to_string()))
                .unwrap_or_else(|| "an unnamed socket".into());
            log::info!("serving on the socket handed over: {name}");
            l
        }
        None => listen::bind(socket)?,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let served = listener.try_clone()?;
    let stop = rt.block_on(async move {
        served.set_nonblocking(true)?;
        let uds = tokio::net::UnixListener::from_std(served)?;
        let sn = Arc::new(tokio::task::block_in_place(|| SheafSnapshotter::open(cfg))?);
        if let Some(addr) = sn.cfg.metrics {
            let m = sn.clone();
            tokio::spawn(async move {
                if let Err(e) = metrics::serve(addr, move || m.metrics()).await {
                    log::error!("{e}");
                }
            });
        }
        notify_ready();
        log::info!("ready");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(uds);
        let (tx, rx) = tokio::sync::watch::channel(None::<Stop>);
        tokio::spawn(async move {
            use tokio::signal::unix::{signal, SignalKind};
            let (Ok(mut term), Ok(mut hup)) = (
                signal(SignalKind::terminate()),
                signal(SignalKind::hangup()),
            ) else {
                return log::error!("cannot handle signals");
            };
            let why = tokio::select! {
                _ = term.recv() => Stop::Exit,
                _ = tokio::signal::ctrl_c() => Stop::Exit,
                _ = hup.recv() => Stop::Restart,
            };
            if why == Stop::Restart {
                log::info!(
                    "SIGHUP: finishing the requests being answered, then restarting in place"
                );
            }
            let _ = tx.send(Some(why));
        });
        let signalled = {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(Option::is_some).await;
            }
        };
        let server = tonic::transport::Server::builder()
            .add_service(snapshots::server(sn))
            .serve_with_incoming_shutdown(incoming, signalled);
        // A request that does not end does not hold a restart or an exit
        // for ever.
        let overdue = {
            let mut rx = rx.clone();
            async move {
                let _ = rx.wait_for(Option::is_some).await;
                tokio::time::sleep(Duration::from_secs(10)).await;
                log::warn!("requests still running 10 s after the signal; stopping anyway");
            }
        };
        tokio::select! {
            r = server => r.map_err(std::io::Error::other)?,
            _ = overdue => {}
        }
        let why = *rx.borrow();
        Ok::<_, std::io::Error>(why.unwrap_or(Stop::Exit))
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    if stop == Stop::Restart {
        return Err(listen::reexec(&listener));
    }
    Ok(())
}
