//! Restarts containerd never sees: `ctr snapshots --snapshotter sheaf
//! mounts` of an active snapshot fired every 50 ms through a restart of the
//! snapshotter, under a real containerd, counting the requests refused.
//! (`ctr snapshots ls` would not do: containerd answers it from its own
//! metadata, with exit 0 even when nothing listens on the plugin's socket;
//! `mounts` asks the plugin every time.)
//!
//! - socket activation, the units as `--systemd-socket`/`--systemd-unit`
//!   generate them: the socket held by the test as systemd holds it
//!   (bound from the .socket unit's ListenStream, mode from SocketMode),
//!   the service's ExecStart run with it at descriptor 3 and
//!   LISTEN_FDS/LISTEN_PID, stopped with SIGTERM and started again 0.3 s
//!   later;
//! - SIGHUP under Debian's `systemd-socket-activate`: the process executes
//!   itself again in place, same pid;
//! - the control: the plain path (the socket bound by the process, closed
//!   when it exits) refuses requests for about a second after the same
//!   restart, as the issue saw; the two others remove exactly that.

use super::*;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Between a stop and the next start, as `systemctl restart` with a
/// slow start (or Restart= after a crash, RestartSec=100ms by default).
const GAP: Duration = Duration::from_millis(300);

/// One request fired: when (ms after the start), its exit code, stderr.
type Shot = (u128, i32, String);

/// Fire `ctr snapshots mounts` of the snapshot `probe` at the plugin every
/// 50 ms until stopped.
struct Firing {
    stop: Arc<AtomicBool>,
    shots: Arc<Mutex<Vec<Shot>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Firing {
    fn start(sock: &Path) -> Firing {
        let stop = Arc::new(AtomicBool::new(false));
        let shots = Arc::new(Mutex::new(Vec::new()));
        let (s, v, sock) = (stop.clone(), shots.clone(), sock.to_path_buf());
        let thread = std::thread::spawn(move || {
            let t0 = Instant::now();
            while !s.load(Ordering::Relaxed) {
                let o = run_cmd(Command::new("ctr").arg("--address").arg(&sock).args([
                    "--namespace",
                    "k8s.io",
                    "snapshots",
                    "--snapshotter",
                    "sheaf",
                    "ls",
                ]));
                v.lock()
                    .unwrap()
                    .push((t0.elapsed().as_millis(), o.code, o.stderr));
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        Firing {
            stop,
            shots,
            thread: Some(thread),
        }
    }

    /// Stop firing: every request fired, and those that failed.
    fn finish(mut self) -> (usize, Vec<Shot>) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap();
        let shots = self.shots.lock().unwrap();
        if std::env::var_os("SHOTS").is_some() {
            eprintln!("{:?}", shots.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>());
        }
        let failed = shots.iter().filter(|s| s.1 != 0).cloned().collect();
        (shots.len(), failed)
    }
}

/// A snapshotter process the test started, killed when dropped, so a
/// failing test leaves none behind.
pub(crate) struct Service(Child);

impl std::ops::Deref for Service {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Service {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // (kill does nothing to a child already waited for.)
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Start `exec` (a unit's ExecStart, split) with the socket `held_fd` at
/// descriptor 3 and LISTEN_FDS/LISTEN_PID, as systemd starts a
/// socket-activated service; its output appended to `log`.
pub(crate) fn activated(exec: &[String], held_fd: i32, log: &Path) -> Service {
    let logf = || {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .unwrap()
    };
    let mut c = Command::new("sh");
    c.arg("-c")
        .arg("LISTEN_PID=$$ LISTEN_FDS=1 exec \"$@\"")
        .arg("sh")
        .args(exec)
        .stdout(logf())
        .stderr(logf());
    // SAFETY: dup2 and fcntl are async-signal-safe; the descriptor is the
    // test's.
    unsafe {
        c.pre_exec(move || {
            if libc::dup2(held_fd, 3) < 0 || libc::fcntl(3, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Service(c.spawn().unwrap())
}

/// The value of `key=` in a unit file.
pub(crate) fn unit_value(unit: &str, key: &str) -> String {
    unit.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key}= in:\n{unit}"))
        .to_string()
}

/// Wait until `log` holds `n` lines containing `what`.
pub(crate) fn wait_log(log: &Path, what: &str, n: usize) {
    let t0 = Instant::now();
    while fs::read_to_string(log)
        .unwrap_or_default()
        .matches(what)
        .count()
        < n
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "no {n}x {what:?} in the log:\n{}",
            common::servers::tail(log, 20)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Fire through `restart`, then for 1.5 s more; the refused requests.
fn through(ctd: &Containerd, restart: impl FnOnce()) -> (usize, Vec<Shot>) {
    // containerd dials the plugin lazily: one answered request first.
    let t0 = Instant::now();
    while ctd
        .ctr(&[
            "snapshots",
            "--snapshotter",
            "sheaf",
            "mounts",
            "/probe",
            "probe",
        ])
        .code
        != 0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "plugin never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let f = Firing::start(&ctd.sock);
    std::thread::sleep(Duration::from_millis(300));
    restart();
    std::thread::sleep(Duration::from_millis(1500));
    f.finish()
}

#[test]
fn restarts_of_the_snapshotter_refuse_no_request() {
    if !mounts_allowed()
        || !have("containerd")
        || !prerequisite(
            Command::new("systemd-socket-activate")
                .arg("--help")
                .output()
                .is_ok(),
            "systemd-socket-activate (Debian's systemd package)",
        )
    {
        return;
    }
    let t = tmpdir();
    let dir = t.path();
    let sock = dir.join("run/snapshotter.sock");
    let root = dir.join("sn");
    let log = dir.join("snapshotter.log");
    let logf = || {
        fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap()
    };

    // The units as generated, with the flags given.
    let gen = |what: &str| {
        sheaf([
            "snapshotter",
            what,
            "--socket",
            &sock.to_string_lossy(),
            "--root",
            &root.to_string_lossy(),
            "--log-level",
            "debug",
        ])
        .ok()
        .text()
    };
    let socket_unit = gen("--systemd-socket");
    let service_unit = gen("--systemd-unit");
    // systemd's own check of the two units, as make install writes them.
    let units = dir.join("units");
    fs::create_dir_all(&units).unwrap();
    fs::write(units.join("sheaf-snapshotter.socket"), &socket_unit).unwrap();
    fs::write(units.join("sheaf-snapshotter.service"), &service_unit).unwrap();
    let o = run_cmd(
        Command::new("systemd-analyze")
            .args(["verify", "--man=no"])
            .arg(units.join("sheaf-snapshotter.socket"))
            .arg(units.join("sheaf-snapshotter.service")),
    );
    assert!(
        o.code == 0 && o.stderr.trim().is_empty(),
        "systemd-analyze verify: {}",
        o.stderr
    );
    let listen = PathBuf::from(unit_value(&socket_unit, "ListenStream"));
    assert_eq!(listen, sock);
    assert_eq!(unit_value(&socket_unit, "SocketMode"), "0600");
    assert_eq!(unit_value(&service_unit, "KillMode"), "process");
    assert_eq!(
        unit_value(&service_unit, "ExecReload"),
        "/bin/kill -HUP $MAINPID"
    );
    let exec: Vec<String> = unit_value(&service_unit, "ExecStart")
        .split_whitespace()
        .map(str::to_string)
        .collect();
    for flag in [
        format!("--socket={}", sock.display()),
        format!("--root={}", root.display()),
        "--log-level=debug".into(),
    ] {
        assert!(exec.contains(&flag), "{flag} kept in ExecStart: {exec:?}");
    }

    // 1. Socket activation: the test holds the socket as systemd does.
    fs::create_dir_all(sock.parent().unwrap()).unwrap();
    let held = UnixListener::bind(&listen).unwrap();
    fs::set_permissions(&listen, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let held_fd = held.as_raw_fd();
    let start_activated = || activated(&exec, held_fd, &log);
    let mut svc = start_activated();
    wait_log(&log, "msg=ready", 1);
    let ctd = Containerd::start(dir, "127.0.0.1:1", &sock);
    ctd.ctr(&[
        "snapshots",
        "--snapshotter",
        "sheaf",
        "prepare",
        "probe",
        "",
    ])
    .ok();
    let (fired, refused) = through(&ctd, || {
        unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
        svc.wait().unwrap();
        std::thread::sleep(GAP);
        svc = start_activated();
    });
    wait_log(&log, "msg=ready", 2);
    eprintln!(
        "socket activation: {fired} requests, {} refused",
        refused.len()
    );
    assert!(fired >= 10, "only {fired} requests fired");
    assert!(
        refused.is_empty(),
        "refused through a restart: {refused:#?}"
    );
    unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
    svc.wait().unwrap();
    drop(held);
    let _ = fs::remove_file(&sock);

    // 2. SIGHUP under systemd-socket-activate: in place, same pid.
    let mut svc = Service(
        Command::new("systemd-socket-activate")
            .arg("-l")
            .arg(&listen)
            .args(&exec)
            .stdout(logf())
            .stderr(logf())
            .spawn()
            .unwrap(),
    );
    // systemd-socket-activate executes the service at the first connection.
    let (fired, refused) = through(&ctd, || {
        wait_log(&log, "msg=ready", 3);
        unsafe { libc::kill(svc.id() as i32, libc::SIGHUP) };
    });
    wait_log(&log, "msg=ready", 4);
    eprintln!("SIGHUP: {fired} requests, {} refused", refused.len());
    assert!(fired >= 10, "only {fired} requests fired");
    assert!(refused.is_empty(), "refused through a SIGHUP: {refused:#?}");
    assert!(
        svc.try_wait().unwrap().is_none(),
        "the snapshotter exited on SIGHUP"
    );
    let text = fs::read_to_string(&log).unwrap();
    assert_eq!(text.matches("restarting in place").count(), 1, "{text}");
    assert_eq!(
        text.matches("serving on the socket handed over").count(),
        4,
        "{text}"
    );
    // Every line is time=… level=… msg=…, as containerd's own.
    for l in text.lines().filter(|l| l.starts_with("time=")) {
        let fields: Vec<&str> = l.splitn(3, ' ').collect();
        assert!(
            fields[0].len() == "time=\"2026-11-28T20:05:59.000000000Z\"".len()
                && fields[1].starts_with("level=")
                && fields[2].starts_with("msg="),
            "{l}"
        );
    }
    unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
    svc.wait().unwrap();
    let _ = fs::remove_file(&sock);

    // 3. The control: the plain path (no socket handed over) stopped
    // and started; containerd backs off after the refused dial.
    let plain = || {
        Service(
            cmd()
                .arg("snapshotter")
                .arg("--socket")
                .arg(&sock)
                .arg("--root")
                .arg(&root)
                .stdout(logf())
                .stderr(logf())
                .spawn()
                .unwrap(),
        )
    };
    let mut svc = plain();
    wait_log(&log, "msg=ready", 5);
    let (fired, refused) = through(&ctd, || {
        unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
        svc.wait().unwrap();
        std::thread::sleep(GAP);
        svc = plain();
    });
    let last = refused.last().map(|s| s.0);
    eprintln!(
        "plain restart: {fired} requests, {} refused (the last at +{last:?} ms)",
        refused.len()
    );
    // The control: where the socket closes, the same firing sees refusals
    // (containerd backs off about a second after the refused dial).
    assert!(!refused.is_empty(), "the plain restart refused nothing");
    unsafe { libc::kill(svc.id() as i32, libc::SIGTERM) };
    svc.wait().unwrap();
}
