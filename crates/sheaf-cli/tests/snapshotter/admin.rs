//! docs/containers.md's admin sequence ("As an admin runs it, start to
//! finish"), command by command, with a real registry, nginx, containerd
//! and runc. `sheaf` lines run as written (the example registry, web
//! server and system directories replaced by this test's); what needs
//! PID-1 systemd or crictl is done the way they do it: `systemctl enable
//! --now` binds the .socket unit's ListenStream with its SocketMode and
//! starts the service's ExecStart with it (LISTEN_FDS), `reload` sends
//! SIGHUP, `restart` stops and starts with the socket held, `crictl pull`
//! is CRI's PullImage (tests/support/cri_pull.py), `crictl rmi` removes
//! the image, `journalctl -u` reads the service's output. A line of the
//! sequence this test does not know fails it.

use super::restart::{activated, unit_value, wait_log, Service};
use super::*;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;

const DOC: &str = include_str!("../../../../docs/containers.md");

/// The sequence's command lines (continuations joined, comments dropped).
fn sequence() -> Vec<String> {
    let start = DOC
        .find("### As an admin runs it, start to finish")
        .expect("containers.md has the admin sequence");
    let block = DOC[start..]
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("its sh block");
    sh_lines(block.lines())
}

#[test]
fn the_admin_sequence_of_containers_md_runs() {
    if !prerequisite(
        Command::new("systemd-analyze")
            .arg("--help")
            .output()
            .is_ok(),
        "systemd-analyze (Debian's systemd package)",
    ) {
        return;
    }
    run_scenario(admin);
}

fn admin(t: &Path) {
    let lay = layout(t);
    let reg = Registry::start(t);
    reg.push(&lay.oci("gz"), "app:1");
    // Pulled while the snapshotter restarts (its extra layer is not
    // published: containerd fetches and applies that one).
    reg.push(&lay.oci("extra"), "app:2");
    let host = reg.host();
    let www = t.join("www");
    let nginx = Nginx::start_with_root(t, &www);
    let units = t.join("etc/systemd/system");
    fs::create_dir_all(&units).unwrap();
    let cache = t.join("cache");
    let sock = t.join("run/snapshotter.sock");
    let root = t.join("sn");
    let log = t.join("snapshotter.log");
    let image = format!("{host}/app:1");
    let bin_dir = Path::new(bin()).parent().unwrap().to_path_buf();
    let path = format!("{}:{}", bin_dir.display(), std::env::var("PATH").unwrap());
    let subst = |l: &str| {
        l.replace(
            "docker://registry.example/team/app:2.1",
            &format!("docker://{image} --insecure-registry {host}"),
        )
        .replace("registry.example/team/app:2.1", &image)
        .replace("/srv/www/sheaf", &www.join("sheaf").to_string_lossy())
        .replace("https://repo.example/sheaf", &nginx.url("sheaf"))
        .replace("/etc/systemd/system", &units.to_string_lossy())
        .replace("/var/cache/sheaf", &cache.to_string_lossy())
        // The defaults are the system's paths; this test keeps its own.
        .replace(
            "sheaf snapshotter --systemd-socket",
            &format!(
                "sheaf snapshotter --systemd-socket --socket {}",
                sock.display()
            ),
        )
        .replace(
            "sheaf snapshotter --systemd-unit",
            &format!(
                "sheaf snapshotter --systemd-unit --socket {} --root {}",
                sock.display(),
                root.display()
            ),
        )
    };
    let sh = |line: &str| -> Out {
        let o = run_cmd(
            Command::new("bash")
                .args(["-eo", "pipefail", "-c", line])
                .current_dir(t)
                .env("PATH", &path)
                .env_remove("SHEAF_CACHE_DIR"),
        );
        assert_eq!(o.code, 0, "{line}: {}", o.stderr);
        o
    };
    let mut held: Option<UnixListener> = None;
    let mut svc: Option<Service> = None;
    let mut ctd: Option<Containerd> = None;
    let mut exec: Vec<String> = Vec::new();
    let mut printed = Vec::new();
    for line in sequence() {
        let l = subst(&line);
        let word = |w: &str| l.starts_with(w);
        if word("sheaf ") {
            let o = sh(&l);
            printed.push((line.clone(), o.text()));
        } else if word("systemctl daemon-reload") {
            // systemd reads the units: here, systemd's own check of them.
            let o = run_cmd(
                Command::new("systemd-analyze")
                    .args(["verify", "--man=no"])
                    .arg(units.join("sheaf-snapshotter.socket"))
                    .arg(units.join("sheaf-snapshotter.service")),
            );
            assert!(o.code == 0 && o.stderr.trim().is_empty(), "{}", o.stderr);
        } else if word("systemctl enable --now sheaf-snapshotter.socket") {
            let socket_unit = fs::read_to_string(units.join("sheaf-snapshotter.socket")).unwrap();
            let service = fs::read_to_string(units.join("sheaf-snapshotter.service")).unwrap();
            let listen = PathBuf::from(unit_value(&socket_unit, "ListenStream"));
            fs::create_dir_all(listen.parent().unwrap()).unwrap();
            let l = UnixListener::bind(&listen).unwrap();
            let mode = u32::from_str_radix(&unit_value(&socket_unit, "SocketMode"), 8).unwrap();
            fs::set_permissions(&listen, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .unwrap();
            exec = unit_value(&service, "ExecStart")
                .split_whitespace()
                .map(str::to_string)
                .collect();
            svc = Some(activated(&exec, l.as_raw_fd(), &log));
            held = Some(l);
            wait_log(&log, "msg=ready", 1);
        } else if word("systemctl restart containerd") {
            ctd = Some(Containerd::start(t, &host, &sock));
        } else if word("crictl pull ") {
            let before = reg.gets().len();
            let c = ctd.as_ref().expect("containerd started before the pull");
            printed.push((line.clone(), c.pull(&image)));
            let gets = reg.gets()[before..].to_vec();
            for b in lay.strs("gz_blobs") {
                assert!(
                    !gets.iter().any(|g| g.ends_with(b.as_str())),
                    "layer {b} fetched by the pull: {gets:#?}"
                );
            }
        } else if word("journalctl -u sheaf-snapshotter") {
            let text = fs::read_to_string(&log).unwrap();
            let lazy = text.matches(": lazy, from ").count();
            assert_eq!(lazy, lay.strs("gz_blobs").len(), "{text}");
            assert!(text.lines().all(|l| l.starts_with("time=\"")), "{text}");
            printed.push((line.clone(), text));
        } else if word("systemctl reload sheaf-snapshotter") {
            let s = svc.as_ref().unwrap();
            unsafe { libc::kill(s.id() as i32, libc::SIGHUP) };
            wait_log(&log, "msg=ready", 2);
            assert!(svc.as_mut().unwrap().try_wait().unwrap().is_none());
        } else if word("systemctl restart sheaf-snapshotter") {
            let mut s = svc.take().unwrap();
            unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
            s.wait().unwrap();
            svc = Some(activated(&exec, held.as_ref().unwrap().as_raw_fd(), &log));
            wait_log(&log, "msg=ready", 3);
        } else if word("crictl rmi ") {
            let c = ctd.as_ref().unwrap();
            // crictl rmi removes every name CRI gave the image (the tag,
            // the digest reference, the image ID): all there are here.
            for name in c.ctr(&["images", "ls", "-q"]).ok().text().lines() {
                c.ctr(&["images", "rm", "--sync", name]).ok();
            }
            // containerd's garbage collector removes the snapshots.
            let t0 = Instant::now();
            loop {
                let st: serde_json::Value =
                    serde_json::from_slice(&fs::read(root.join("state.json")).unwrap()).unwrap();
                let left = st["snaps"].as_object().map_or(0, |m| m.len());
                if left == 0 {
                    break;
                }
                assert!(
                    t0.elapsed() < Duration::from_secs(30),
                    "{left} snapshots left after the image was removed: {st:#}"
                );
                let lease = c.ctr(&["leases", "create"]).ok().text();
                c.ctr(&["leases", "delete", "--sync", lease.trim()]).ok();
                std::thread::sleep(Duration::from_millis(200));
            }
            assert!(mounts_under(&root).is_empty(), "{:?}", mounts_under(&root));
            let dirs = fs::read_dir(root.join("snapshots")).unwrap().count();
            assert_eq!(dirs, 0, "snapshot directories left");
        } else {
            panic!("a line of the admin sequence this test does not know: {line}");
        }
    }
    assert!(
        ctd.is_some() && held.is_some(),
        "the sequence ran its steps"
    );
    if let Some(mut s) = svc {
        unsafe { libc::kill(s.id() as i32, libc::SIGTERM) };
        let _ = s.wait();
    }
    for (line, out) in printed {
        eprintln!("$ {line}\n{}", out.trim_end());
    }
}
