//! Images in Slurm jobs (docs/slurm.md): a real Slurm cluster of four
//! namespaced nodes (scripts/slurm-cluster.sh: Debian's munged, slurmctld
//! and slurmd, each node with its own network, UTS and mount namespace on a
//! bridge), the SPANK plugin compiled from slurm/sheaf_spank.c, and real
//! `srun`, `sbatch` and `scancel` run by an ordinary user:
//!
//! - a 4-node batch job with `--sheaf` and `--sheaf-pool` loads the pool's
//!   module and reads the dataset at /data on every node, checksums equal to
//!   the source tree's (computed with sha256sum on the tree, not via sheaf);
//! - two jobs on one node at once see their own image at /data, and neither
//!   the host nor the node's slurmd sees either mount; the tasks run with
//!   no_new_privs; the tasks of a step on one node share one mount;
//! - a cancelled job, a job whose node is set DOWN and a job past its time
//!   limit leave no mount, no process and no namespace;
//! - a mount point in the system's directories is refused before submission,
//!   one reached through a symbolic link or in another user's directory on
//!   the node, and root makes nothing there;
//! - under a signature policy a tampered image fails the step with one line;
//! - with `scope=job` the batch step and the srun steps share one mount per
//!   node, and a cancelled job leaves nothing;
//! - with `mode=bcast` a 4-node step's first node reads the image and
//!   sbcast sends it once to every node, which mounts its own copy (gone at
//!   the step's end); an unreadable image fails every node's tasks with one
//!   line; a signature policy holds for the copies; a bcast_dir another
//!   user made is refused;
//! - a URL image whose server is down when the step starts, or goes down
//!   mid-job (for less than sheaf's --timeout), is a wait, not a failure.
//!
//! About 100 s, most of it waiting for Slurm to end the job past its (one
//! minute, the least) time limit while the rest runs.

mod common;
use common::*;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const USER: &str = "sheaf-slurm-test";
const NODES: usize = 4;

/// The cluster, stopped (and /dev/fuse's mode restored) when dropped, also
/// when the test fails.
struct Cluster {
    work: PathBuf,
    conf: PathBuf,
    fuse_mode: u32,
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../scripts/slurm-cluster.sh")
}

impl Cluster {
    fn up(work: &Path, plugstack: &str) -> Cluster {
        let fuse_mode = fs::metadata("/dev/fuse").unwrap().permissions().mode() & 0o7777;
        let c = Cluster {
            work: work.to_path_buf(),
            conf: work.join("etc/slurm.conf"),
            fuse_mode,
        };
        // The job's user mounts through fusermount3, which needs /dev/fuse
        // (0600 on this machine; Debian's default is 0666).
        fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(0o666)).unwrap();
        let o = run_cmd(
            Command::new("bash")
                .arg(script())
                .arg("up")
                .arg(work)
                .arg(NODES.to_string())
                .env("PLUGSTACK", plugstack),
        );
        assert_eq!(o.code, 0, "{}", o.describe());
        c
    }

    /// A Slurm command as the job's user, from `dir`, started with its
    /// output piped.
    fn spawn(&self, dir: &Path, args: &[&str]) -> std::process::Child {
        self.user(dir, args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    }

    /// A Slurm command as the job's user, from `dir`.
    fn user(&self, dir: &Path, args: &[&str]) -> Command {
        let mut c = Command::new("runuser");
        c.args(["-u", USER, "--"])
            .args(args)
            .env("SLURM_CONF", &self.conf)
            .current_dir(dir)
            .stdin(Stdio::null());
        c
    }

    fn plugstack(&self, text: &str) {
        fs::write(self.work.join("etc/plugstack.conf"), text).unwrap();
    }

    fn job_state(&self, id: &str) -> String {
        let o = run_cmd(
            Command::new("scontrol")
                .args(["show", "job", id, "-o"])
                .env("SLURM_CONF", &self.conf),
        );
        o.text()
            .split_whitespace()
            .find_map(|w| w.strip_prefix("JobState="))
            .unwrap_or("GONE")
            .to_string()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("bash")
            .arg(script())
            .arg("down")
            .arg(&self.work)
            .status();
        let _ = fs::set_permissions("/dev/fuse", fs::Permissions::from_mode(self.fuse_mode));
    }
}

/// The mount points the plugin makes on the nodes (the host's file system
/// here) and leaves, empty, for the next job: removed at the end if they
/// were not there before.
struct MadeDirs(Vec<PathBuf>);

impl MadeDirs {
    fn new(dirs: &[&str]) -> MadeDirs {
        MadeDirs(
            dirs.iter()
                .map(PathBuf::from)
                .filter(|d| !d.exists())
                .collect(),
        )
    }
}

impl Drop for MadeDirs {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = fs::remove_dir(d);
        }
    }
}

fn have(cmd: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {cmd}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn uid_of(user: &str) -> u32 {
    run_cmd(Command::new("id").args(["-u", user]))
        .ok()
        .text()
        .trim()
        .parse()
        .unwrap()
}

/// What the jobs could have left: processes of the job's user, and mounts
/// (sheaf's FUSE mounts of our images, the plugin's tmpfs) in any process's
/// mount namespace (a namespace lives only while a process is in it, so
/// none listed means none left).
/// Processes in a namespace where `except` is mounted (a job still meant to
/// run) are not counted.
fn leftovers(images: &Path, uid: u32, except: &Path) -> Vec<String> {
    let mut left = Vec::new();
    let img = images.to_string_lossy().to_string();
    let except = format!(" {} ", except.display());
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let info = fs::read_to_string(e.path().join("mountinfo")).unwrap_or_default();
        if info.contains(&except) {
            continue;
        }
        let status = fs::read_to_string(e.path().join("status")).unwrap_or_default();
        let owner = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next().map(str::to_string));
        let cmdline = fs::read(e.path().join("cmdline"))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
            .unwrap_or_default();
        if owner == Some(uid.to_string()) {
            left.push(format!("process {name} of {USER}: {cmdline}"));
        }
        for l in info.lines() {
            if l.contains(" sheaf-slurm ") || (l.contains("fuse.sheaf") && l.contains(&img)) {
                left.push(format!("mount in the namespace of {name} ({cmdline}): {l}"));
            }
        }
    }
    left
}

/// Poll until nothing is left (the step's end is asynchronous to srun's).
fn assert_nothing_left(images: &Path, uid: u32, except: &Path, what: &str) {
    let t = Instant::now();
    loop {
        let left = leftovers(images, uid, except);
        if left.is_empty() {
            return;
        }
        if t.elapsed() > Duration::from_secs(30) {
            panic!("{what}: left behind:\n{}", left.join("\n"));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// A tree of plain files with plain names (sha256sum's output is compared
/// line by line).
fn dataset(root: &Path) {
    let mut r = Rng::new(56);
    for d in ["a", "b/c", "d"] {
        fs::create_dir_all(root.join(d)).unwrap();
        for i in 0..6 {
            let n = r.below(300_000) as usize;
            write(&root.join(d).join(format!("f{i}.bin")), &r.bytes(n));
        }
    }
    write(&root.join("README"), b"the dataset\n");
}

/// A 2-node batch job whose step reads /data and sleeps, cancelled
/// (`scancel`) once both nodes have read.
fn cancel_once_up(cl: &Cluster, out: &Path, data_arg: &str, log: &str) {
    let o = run_cmd(&mut cl.user(
        out,
        &[
            "sbatch",
            "--parsable",
            "-N2",
            "-w",
            "n2,n3",
            data_arg,
            "-o",
            log,
            "--wrap",
            "srun sh -c 'ls /data >/dev/null && echo up-$(hostname); sleep 600'",
        ],
    ))
    .ok();
    let id = o.text().trim().to_string();
    let t0 = Instant::now();
    loop {
        let text = fs::read_to_string(out.join(log)).unwrap_or_default();
        if text.matches("up-").count() == 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "job {id}, {log}: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    run_cmd(&mut cl.user(out, &["scancel", &id])).ok();
}

/// The lines of a step's standard error that are sheaf's (not srun's).
fn sheaf_lines(o: &Out) -> Vec<&str> {
    o.stderr
        .lines()
        .filter(|l| l.starts_with("sheaf"))
        .collect()
}

const SUMS: &str = "cd \"$1\" && find . -type f | LC_ALL=C sort | xargs sha256sum";

#[test]
fn jobs_see_their_images_and_leave_nothing_behind() {
    if !prerequisite(is_root(), "root, for namespaces and slurmd") {
        return;
    }
    for c in [
        "srun",
        "sbatch",
        "slurmd",
        "slurmctld",
        "munged",
        "cc",
        "runuser",
    ] {
        assert!(
            prerequisite(have(c), &format!("{c} (scripts/deps.sh test)")),
            "{c}"
        );
    }
    assert!(
        prerequisite(
            Path::new("/usr/include/slurm/spank.h").exists(),
            "slurm/spank.h (libslurm-dev)"
        ),
        "spank.h"
    );
    assert!(
        prerequisite(Path::new("/usr/share/lmod/lmod/init/bash").exists(), "Lmod"),
        "lmod"
    );
    if !Command::new("id")
        .arg(USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        run_cmd(Command::new("useradd").args(["--create-home", "--shell", "/bin/sh", USER])).ok();
    }
    let uid = uid_of(USER);
    let t = tmpdir();
    let top = t.path();
    fs::set_permissions(top, fs::Permissions::from_mode(0o755)).unwrap();
    let img = top.join("img");
    fs::create_dir_all(img.join("pools/tools")).unwrap();

    // The plugin, from the source under test.
    let so = img.join("sheaf_spank.so");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../slurm/sheaf_spank.c");
    run_cmd(
        Command::new("cc")
            .args([
                "-std=gnu11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-O2",
                "-fPIC",
                "-shared",
                "-o",
            ])
            .arg(&so)
            .arg(&src),
    )
    .ok();

    // The images: the dataset, two one-file images, a pool, a signed image
    // and a tampered one (another tree's image carrying its signature).
    let data_src = top.join("src");
    dataset(&data_src);
    let data = img.join("data.sheaf");
    build(&data_src, &data, &[]).ok();
    for which in ["A", "B"] {
        let d = top.join(format!("src-{which}"));
        fs::create_dir_all(&d).unwrap();
        write(&d.join("which"), which.as_bytes());
        build(&d, &img.join(format!("{which}.sheaf")), &[]).ok();
    }
    let pool = top.join("pool");
    sheaf(["pool".as_ref(), "init".as_ref(), pool.as_os_str()]).ok();
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.join("pools/tools/1.0.sheaf").as_os_str(),
        "--name".as_ref(),
        "tools/1.0".as_ref(),
    ])
    .ok();
    let key = top.join("key");
    run_cmd(
        Command::new("ssh-keygen")
            .args(["-q", "-t", "ed25519", "-N", "", "-f"])
            .arg(&key),
    )
    .ok();
    let signed = img.join("signed.sheaf");
    fs::copy(img.join("A.sheaf"), &signed).unwrap();
    sheaf_in([
        "sign".as_ref(),
        signed.as_os_str(),
        "-k".as_ref(),
        key.as_os_str(),
    ])
    .ok();
    let unsigned_len = fs::metadata(img.join("A.sheaf")).unwrap().len() as usize;
    let mut tampered = fs::read(img.join("B.sheaf")).unwrap();
    tampered.extend_from_slice(&fs::read(&signed).unwrap()[unsigned_len..]);
    write(&img.join("tampered.sheaf"), &tampered);
    let public = fs::read_to_string(top.join("key.pub")).unwrap();
    let public: Vec<&str> = public.split_whitespace().take(2).collect();
    write(
        &img.join("allowed_signers"),
        format!("ops@site {}\n", public.join(" ")).as_bytes(),
    );
    write(
        &img.join("policy.toml"),
        format!(
            "[signatures]\nrequire = true\nsigners = \"{}\"\n",
            img.join("allowed_signers").display()
        )
        .as_bytes(),
    );
    run_cmd(Command::new("chmod").args(["-R", "a+rX"]).arg(&img)).ok();
    // Where the user's jobs write (and run from).
    let out = top.join("out");
    fs::create_dir(&out).unwrap();
    run_cmd(Command::new("chown").arg(USER).arg(&out)).ok();

    // Each node's cache in its own node-local directory, one per user.
    let cache = top.join("cluster/local/sheaf-cache-%u");
    let plain = format!(
        "required {} sheaf={} pools={} cache_dir={}\n",
        so.display(),
        bin(),
        img.join("pools").display(),
        cache.display()
    );
    let started = Instant::now();
    // Dropped after the cluster (declared before it).
    let _made = MadeDirs::new(&[
        "/data",
        "/sheaf/pools/tools/1.0",
        "/sheaf/pools/tools",
        "/sheaf/pools",
        "/sheaf",
    ]);
    let cl = Cluster::up(&top.join("cluster"), &plain);
    eprintln!("cluster of {NODES} nodes up in {:?}", started.elapsed());
    let data_arg = format!("--sheaf={}:/data", data.display());
    // The job past its time limit has an image of its own: what it holds
    // while it runs is not a leftover of the others.
    let late = img.join("late.sheaf");
    fs::copy(&data, &late).unwrap();
    fs::set_permissions(&late, fs::Permissions::from_mode(0o644)).unwrap();

    // A job past its time limit (one minute, Slurm's least), started first:
    // the rest runs while it waits to be killed.
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "sbatch",
            "--parsable",
            "-N1",
            "-w",
            "n4",
            "--time=1",
            &format!("--sheaf={}:/data", late.display()),
            "-o",
            "timeout.out",
            "--wrap",
            "ls /data && sleep 600",
        ],
    ))
    .ok();
    let timeout_job = o.text().trim().to_string();

    // 1. A 4-node batch job: the pool's module loads, and every node reads
    // the dataset at /data with the source tree's checksums.
    let job = out.join("job.sh");
    write(
        &job,
        format!(
            "#!/bin/bash\n#SBATCH -N {NODES}\n#SBATCH {data_arg}\n#SBATCH --sheaf-pool=tools/1.0\n\
             #SBATCH -o batch.out\n\
             source /usr/share/lmod/lmod/init/bash\nmodule load hello/1.0 && hello\n\
             srun -o sums-%t bash -c 'hostname; {}' sh /data\n",
            SUMS.replace('\'', "'\\''")
        )
        .as_bytes(),
    );
    let t0 = Instant::now();
    // (Polled here: `sbatch --wait` polls every few seconds.)
    let o = run_cmd(&mut cl.user(&out, &["sbatch", "--parsable", "job.sh"])).ok();
    let id = o.text().trim().to_string();
    let state = loop {
        let s = cl.job_state(&id);
        if !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"].contains(&s.as_str()) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "job {id}: {s}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let batch = fs::read_to_string(out.join("batch.out")).unwrap_or_default();
    assert_eq!(state, "COMPLETED", "batch.out:\n{batch}");
    eprintln!("4-node batch job in {:?}:\n{batch}", t0.elapsed());
    assert!(batch.contains("hello from a sheaf pool"), "{batch}");
    let want = run_cmd(Command::new("bash").args(["-c", SUMS, "sh"]).arg(&data_src))
        .ok()
        .text();
    assert_eq!(want.lines().count(), 19, "{want}");
    let mut hosts = Vec::new();
    for i in 0..NODES {
        let got = fs::read_to_string(out.join(format!("sums-{i}"))).unwrap();
        let (host, sums) = got.split_once('\n').unwrap();
        assert_eq!(sums, want, "node {host}");
        hosts.push(host.to_string());
    }
    hosts.sort();
    assert_eq!(hosts, ["n1", "n2", "n3", "n4"]);
    assert_nothing_left(&img, uid, &late, "the 4-node job");

    // 2. Two jobs on one node at once, each its own image at /data.
    let two: Vec<_> = ["A", "B"]
        .iter()
        .map(|w| {
            cl.spawn(
                &out,
                &[
                    "srun",
                    "-N1",
                    "-n1",
                    "-w",
                    "n1",
                    &format!("--sheaf={}:/data", img.join(format!("{w}.sheaf")).display()),
                    "sh",
                    "-c",
                    "cat /data/which; echo; grep -c ' /data fuse.sheaf ' /proc/self/mounts; grep NoNewPrivs /proc/self/status; \
                     touch started-$SLURM_JOB_ID; while [ $(ls started-* | wc -l) -lt 2 ]; do sleep 0.1; done; \
                     cat /data/which",
                ],
            )
        })
        .collect();
    // While both run: neither mount is in the host's namespace or n1's slurmd's.
    let t0 = Instant::now();
    while fs::read_dir(&out)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("started-"))
        .count()
        < 2
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the two jobs did not run at once"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let slurmd = fs::read_to_string(cl.work.join("nodes/n1/slurmd.pid")).unwrap();
    for p in ["self".to_string(), slurmd.trim().to_string()] {
        let info = fs::read_to_string(format!("/proc/{p}/mountinfo")).unwrap();
        assert!(
            !info.contains("fuse.sheaf") || !info.contains(&*img.to_string_lossy()),
            "{p}: {info}"
        );
        assert!(!info.contains("sheaf-slurm"), "{p}: {info}");
    }
    for (w, c) in ["A", "B"].iter().zip(two) {
        let o = c.wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&o.stdout);
        assert!(
            o.status.success(),
            "{w}: {text} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        assert_eq!(text, format!("{w}\n1\nNoNewPrivs:\t1\n{w}"), "job {w}");
    }
    assert_nothing_left(&img, uid, &late, "the two jobs on n1");

    // Tasks of a step on one node share one mount (one serving process):
    // the same device at /data.
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun", "-N1", "-n2", "-w", "n2", &data_arg, "stat", "-c", "%d", "/data",
        ],
    ))
    .ok();
    let text = o.text();
    let devs: Vec<&str> = text.lines().collect();
    assert!(devs.len() == 2 && devs[0] == devs[1], "{}", o.describe());

    // A node set DOWN under a running job: the job is killed there, and
    // nothing is left.
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "sbatch",
            "--parsable",
            "--no-requeue",
            "-N1",
            "-w",
            "n3",
            &data_arg,
            "-o",
            "down.out",
            "--wrap",
            "ls /data >/dev/null && echo up; sleep 600",
        ],
    ))
    .ok();
    let id = o.text().trim().to_string();
    let t0 = Instant::now();
    while !fs::read_to_string(out.join("down.out"))
        .unwrap_or_default()
        .contains("up")
    {
        assert!(t0.elapsed() < Duration::from_secs(30), "job {id} never ran");
        std::thread::sleep(Duration::from_millis(100));
    }
    run_cmd(
        Command::new("scontrol")
            .args(["update", "nodename=n3", "state=down", "reason=tests/slurm"])
            .env("SLURM_CONF", &cl.conf),
    )
    .ok();
    assert_nothing_left(&img, uid, &late, "the job on the node set down");
    // Back in service (ReturnToService=2 may have done it already).
    let t0 = Instant::now();
    loop {
        let _ = run_cmd(
            Command::new("scontrol")
                .args(["update", "nodename=n3", "state=resume"])
                .env("SLURM_CONF", &cl.conf),
        );
        let st = run_cmd(
            Command::new("sinfo")
                .args(["-h", "-n", "n3", "-o", "%T"])
                .env("SLURM_CONF", &cl.conf),
        )
        .text();
        if st.trim() == "idle" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "n3: {st}");
        std::thread::sleep(Duration::from_millis(200));
    }

    // 3. scancel mid-job.
    cancel_once_up(&cl, &out, &data_arg, "cancel.out");
    assert_nothing_left(&img, uid, &late, "the cancelled job");

    // A mount point in the system's directories is refused before the job
    // is submitted, in one line of the plugin's.
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N1",
            &format!("--sheaf={}:/etc", data.display()),
            "true",
        ],
    ));
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(
        o.stderr
            .lines()
            .next()
            .is_some_and(|l| l.starts_with("srun: error: sheaf: /etc: the mount point must be")),
        "{}",
        o.describe()
    );

    // A DEST reached through a symbolic link the user made, or in another
    // user's directory: refused on the node in one line, and root made
    // nothing there (the holder walks DEST by descriptor, never following a
    // link, and makes directories only in root's or the user's).
    std::os::unix::fs::symlink(&img, out.join("ln")).unwrap();
    let others = top.join("others");
    fs::create_dir(&others).unwrap();
    fs::set_permissions(&others, fs::Permissions::from_mode(0o777)).unwrap();
    run_cmd(Command::new("chown").arg("nobody").arg(&others)).ok();
    for dest in [out.join("ln/planted"), others.join("planted")] {
        let o = run_cmd(&mut cl.user(
            &out,
            &[
                "srun",
                "-N1",
                "-w",
                "n1",
                &format!("--sheaf={}:{}", data.display(), dest.display()),
                "true",
            ],
        ));
        let ours = sheaf_lines(&o);
        assert!(
            o.code != 0
                && ours.len() == 1
                && ours[0].starts_with(&format!("sheaf: error: {}: ", dest.display())),
            "{}",
            o.describe()
        );
        assert!(o.stderr.contains("exit code 125"), "{}", o.describe());
    }
    assert!(
        !img.join("planted").exists(),
        "root made a directory through the link"
    );
    assert!(
        !others.join("planted").exists(),
        "root made a directory in another user's"
    );
    fs::remove_file(out.join("ln")).unwrap();

    // 4. A tampered image under a signature policy: one line, a failed step.
    cl.plugstack(&format!(
        "required {} sheaf={} config={}\n",
        so.display(),
        bin(),
        img.join("policy.toml").display()
    ));
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N1",
            "-w",
            "n1",
            &format!("--sheaf={}:/data", img.join("tampered.sheaf").display()),
            "cat",
            "/data/which",
        ],
    ));
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(o.stdout.is_empty(), "{}", o.describe());
    let ours = sheaf_lines(&o);
    assert_eq!(ours.len(), 1, "{}", o.describe());
    assert!(
        ours[0].starts_with("sheaf: error: ") && ours[0].contains("tampered.sheaf: refused"),
        "{}",
        o.describe()
    );
    assert!(o.stderr.contains("exit code 125"), "{}", o.describe());
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N1",
            "-w",
            "n1",
            &format!("--sheaf={}:/data", signed.display()),
            "cat",
            "/data/which",
        ],
    ))
    .ok();
    assert_eq!(o.text(), "A");
    cl.plugstack(&plain);
    assert_nothing_left(&img, uid, &late, "the policy's steps");

    // scope=job: the prolog mounts once per node, the batch step and every
    // srun step share it (one device at /data on a node), the epilog ends
    // it, also for a cancelled job.
    let state = top.join("cluster/state");
    cl.plugstack(&format!(
        "required {} sheaf={} scope=job state_dir={}\n",
        so.display(),
        bin(),
        state.display()
    ));
    write(
        &out.join("shared.sh"),
        format!(
            "#!/bin/bash\n#SBATCH -N 2\n#SBATCH {data_arg}\n#SBATCH -o shared.out\n\
             echo \"$(hostname) batch $(stat -c %d /data)\"\n\
             for s in 1 2; do srun bash -c \"echo \\$(hostname) step$s \\$(stat -c %d /data)\"; done\n"
        )
        .as_bytes(),
    );
    let o = run_cmd(&mut cl.user(&out, &["sbatch", "--parsable", "shared.sh"])).ok();
    let id = o.text().trim().to_string();
    let t0 = Instant::now();
    let st = loop {
        let s = cl.job_state(&id);
        if !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING"].contains(&s.as_str()) {
            break s;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "job {id}: {s}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let shared = fs::read_to_string(out.join("shared.out")).unwrap_or_default();
    assert_eq!(st, "COMPLETED", "{shared}");
    let mut dev: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for l in shared.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        assert_eq!(w.len(), 3, "{shared}");
        dev.entry(w[0]).or_default().push(w[2]);
    }
    assert_eq!(dev.len(), 2, "{shared}");
    for (host, d) in &dev {
        let want = if dev.keys().next() == Some(host) {
            3
        } else {
            2
        };
        assert_eq!(d.len(), want, "{host}: {shared}");
        assert!(
            d.iter().all(|x| x == &d[0]),
            "{host} saw more than one mount: {shared}"
        );
    }
    assert_nothing_left(&img, uid, &late, "the job-scope job");
    cancel_once_up(&cl, &out, &data_arg, "cancel-job.out");
    assert_nothing_left(&img, uid, &late, "the cancelled job-scope job");
    let t0 = Instant::now();
    while fs::read_dir(&state).map(|d| d.count()).unwrap_or(0) > 0 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "state files left in {}",
            state.display()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    cl.plugstack(&plain);

    // 5. mode=bcast: a 4-node step's first node reads the image once and
    // sbcast sends it to each node's bcast_dir; every node mounts its own
    // copy, and the copies are gone at the step's end.
    let bcast_dir = cl.work.join("local/sheaf-bcast");
    let bcast = format!(
        "required {} sheaf={} mode=bcast bcast_dir={}",
        so.display(),
        bin(),
        bcast_dir.display()
    );
    cl.plugstack(&format!("{bcast}\n"));
    run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            &format!("-N{NODES}"),
            &data_arg,
            "-o",
            "bcast-%t",
            "bash",
            "-c",
            &format!(
                "hostname; grep -o ' /data ro.* fuse.sheaf [^ ]*' /proc/self/mountinfo; {}",
                SUMS
            ),
            "sh",
            "/data",
        ],
    ))
    .ok();
    for i in 0..NODES {
        let got = fs::read_to_string(out.join(format!("bcast-{i}"))).unwrap();
        let mut lines = got.splitn(3, '\n');
        let host = lines.next().unwrap();
        let source = lines.next().unwrap();
        assert_eq!(lines.next().unwrap(), want, "node {host} in mode=bcast");
        // Each node mounted the copy in its own bcast_dir, not the image
        // on shared storage.
        assert!(
            source.starts_with(" /data ro")
                && source.contains(&format!("{}/", bcast_dir.display())),
            "node {host}: {source}"
        );
    }
    // The data went through sbcast, once to each node (slurmd logs each
    // file's first block).
    for k in 1..=NODES {
        let log = fs::read_to_string(cl.work.join(format!("nodes/n{k}/slurmd.log"))).unwrap();
        let sent = log
            .lines()
            .filter(|l| l.contains("sbcast req_uid") && l.contains("/0.sheaf block_no=1"))
            .count();
        assert_eq!(sent, 1, "n{k}: {sent} sbcasts of the image");
    }
    let copies_left = || -> Vec<PathBuf> {
        (1..=NODES)
            .flat_map(|k| {
                fs::read_dir(cl.work.join(format!("nodes/n{k}/local/sheaf-bcast")))
                    .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
                    .unwrap_or_default()
            })
            .collect()
    };
    let no_copies_left = |what: &str| {
        let t0 = Instant::now();
        while !copies_left().is_empty() {
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what}: copies left: {:?}",
                copies_left()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    assert_nothing_left(&img, uid, &late, "the bcast step");
    no_copies_left("the bcast step");
    // A cancelled job leaves no copy either.
    cancel_once_up(&cl, &out, &data_arg, "cancel-bcast.out");
    assert_nothing_left(&img, uid, &late, "the cancelled bcast job");
    no_copies_left("the cancelled bcast job");
    // An image the user cannot read: sbcast refuses it on the first node,
    // and every node's tasks say so in one line, at once.
    let secret = img.join("secret.sheaf");
    fs::copy(&data, &secret).unwrap();
    fs::set_permissions(&secret, fs::Permissions::from_mode(0o600)).unwrap();
    let t0 = Instant::now();
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N3",
            &format!("--sheaf={}:/data", secret.display()),
            "true",
        ],
    ));
    assert!(t0.elapsed() < Duration::from_secs(20), "{:?}", t0.elapsed());
    assert_ne!(o.code, 0, "{}", o.describe());
    let ours = sheaf_lines(&o);
    assert_eq!(ours.len(), 3, "{}", o.describe());
    for l in &ours {
        assert_eq!(
            *l,
            format!(
                "sheaf: error: {s}: sbcast to the step's nodes: Can't open `{s}`: Permission denied",
                s = secret.display()
            ),
            "{}",
            o.describe()
        );
    }
    assert_nothing_left(&img, uid, &late, "the refused bcast step");
    no_copies_left("the refused bcast step");
    // Under a signature policy the copies are checked as the image is: the
    // signed one (and its signature) mounts, the tampered one is refused,
    // named as the user named it.
    cl.plugstack(&format!(
        "{bcast} config={}\n",
        img.join("policy.toml").display()
    ));
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N2",
            &format!("--sheaf={}:/data", signed.display()),
            "cat",
            "/data/which",
        ],
    ))
    .ok();
    assert_eq!(o.text(), "AA");
    let o = run_cmd(&mut cl.user(
        &out,
        &[
            "srun",
            "-N2",
            &format!("--sheaf={}:/data", img.join("tampered.sheaf").display()),
            "true",
        ],
    ));
    let ours = sheaf_lines(&o);
    assert_eq!(ours.len(), 2, "{}", o.describe());
    assert!(
        ours.iter().all(|l| l.starts_with(&format!(
            "sheaf: error: {}: refused",
            img.join("tampered.sheaf").display()
        ))),
        "{}",
        o.describe()
    );
    // The user plants a FIFO where the first node's marker will arrive (their
    // own step directory, from another job on the node): root never blocks
    // on it nor reads it; the node's tasks say so in one line, at once.
    cl.plugstack(&format!("{bcast} timeout=120\n"));
    let racer = run_cmd(&mut cl.user(
        &out,
        &[
            "sbatch",
            "--parsable",
            "-N1",
            "-w",
            "n2",
            "-o",
            "racer.out",
            "--wrap",
            &format!(
                "d={}/$((SLURM_JOB_ID + 1)).0; echo ready; for i in $(seq 3000); do \
                 [ -d $d ] && mkfifo $d/done 2>/dev/null && echo planted && exit 0; sleep 0.01; done",
                bcast_dir.display()
            ),
        ],
    ))
    .ok();
    let racer = racer.text().trim().to_string();
    let t0 = Instant::now();
    while !fs::read_to_string(out.join("racer.out"))
        .unwrap_or_default()
        .contains("ready")
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "racer {racer} never ran"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let t0 = Instant::now();
    let o = run_cmd(&mut cl.user(&out, &["srun", "-N2", "-w", "n1,n2", &data_arg, "true"]));
    let took = t0.elapsed();
    let racer_out = fs::read_to_string(out.join("racer.out")).unwrap_or_default();
    assert!(
        racer_out.contains("planted"),
        "the FIFO was not planted: {racer_out}"
    );
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(took < Duration::from_secs(30), "{took:?}: {}", o.describe());
    assert!(
        o.stderr.lines().any(|l| l.starts_with("sheaf: error: ")
            && l.ends_with("/done: not a file sbcast made: refused")),
        "{}",
        o.describe()
    );
    assert_nothing_left(&img, uid, &late, "the step with a planted FIFO");
    no_copies_left("the step with a planted FIFO");

    // Another user made bcast_dir first (in the nodes' world-writable
    // local directory): refused, and nothing is written into it.
    let evil = cl.work.join("local/evil-bcast");
    for k in 1..=NODES {
        let d = cl.work.join(format!("nodes/n{k}/local/evil-bcast"));
        fs::create_dir(&d).unwrap();
        run_cmd(Command::new("chown").arg("nobody").arg(&d)).ok();
    }
    cl.plugstack(&format!(
        "required {} sheaf={} mode=bcast bcast_dir={}\n",
        so.display(),
        bin(),
        evil.display()
    ));
    let o = run_cmd(&mut cl.user(&out, &["srun", "-N2", &data_arg, "true"]));
    let ours = sheaf_lines(&o);
    assert_eq!(ours.len(), 2, "{}", o.describe());
    assert!(
        ours.iter().all(|l| *l
            == format!(
                "sheaf: error: bcast_dir {}: not a directory of root's that only root may write: refused",
                evil.display()
            )),
        "{}",
        o.describe()
    );
    for k in 1..=NODES {
        let d = cl.work.join(format!("nodes/n{k}/local/evil-bcast"));
        assert_eq!(fs::read_dir(&d).unwrap().count(), 0, "{}", d.display());
    }
    cl.plugstack(&plain);
    assert_nothing_left(&img, uid, &late, "the bcast steps");

    // 6. A URL image whose server goes down mid-job, for less than sheaf's
    // --timeout: the tasks' reads wait for it, and their bytes are right.
    let url_src = top.join("src-url");
    fs::create_dir_all(&url_src).unwrap();
    write(&url_src.join("README"), b"served over HTTP\n");
    write(&url_src.join("big.bin"), &Rng::new(7).bytes(32 << 20));
    build(&url_src, &img.join("url.sheaf"), &[]).ok();
    fs::set_permissions(img.join("url.sheaf"), fs::Permissions::from_mode(0o644)).unwrap();
    let want_url = run_cmd(Command::new("bash").args(["-c", SUMS, "sh"]).arg(&url_src))
        .ok()
        .text();
    let mut web = servers::Nginx::start_also_on(&top.join("nginx"), &img, "10.78.0.254");
    let url = format!("http://10.78.0.254:{}/url.sheaf", web.port);
    // Down when the step starts (never reached yet), back 3 s later: the
    // mount waits for it and the step reads the right bytes.
    web.stop();
    let early = cl.spawn(
        &out,
        &[
            "srun",
            "-N1",
            "-w",
            "n1",
            &format!("--sheaf={url}:/data"),
            "cat",
            "/data/README",
        ],
    );
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    web.restart();
    let o = early.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the step started with its server down: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout), "served over HTTP\n");
    assert!(down.elapsed() >= Duration::from_secs(3));
    assert_nothing_left(&img, uid, &late, "the step that waited for its server");
    let step = cl.spawn(
        &out,
        &[
            "srun",
            "-N2",
            "-w",
            "n2,n3",
            &format!("--sheaf={url}:/data"),
            "-o",
            "url-%t",
            "bash",
            "-c",
            &format!(
                "cat /data/README >/dev/null && touch mounted-$SLURM_PROCID && \
                     while [ ! -e go ]; do sleep 0.05; done; s=$(date +%s%N); \
                     ({SUMS}) && echo $(( ($(date +%s%N) - s) / 1000000 )) > read-ms-$SLURM_PROCID"
            ),
            "sh",
            "/data",
        ],
    );
    let t0 = Instant::now();
    while !(out.join("mounted-0").exists() && out.join("mounted-1").exists()) {
        let url_out = fs::read_to_string(out.join("url-0")).unwrap_or_default();
        assert!(t0.elapsed() < Duration::from_secs(30), "url-0: {url_out}");
        std::thread::sleep(Duration::from_millis(20));
    }
    web.stop();
    write(&out.join("go"), b"");
    let down = Instant::now();
    std::thread::sleep(Duration::from_secs(3));
    web.restart();
    let o = step.wait_with_output().unwrap();
    let waited = down.elapsed();
    let outs: Vec<String> = (0..2)
        .map(|i| fs::read_to_string(out.join(format!("url-{i}"))).unwrap_or_default())
        .collect();
    assert!(
        o.status.success(),
        "{}\n{outs:?}",
        String::from_utf8_lossy(&o.stderr)
    );
    for (i, got) in outs.iter().enumerate() {
        assert_eq!(*got, want_url, "task {i} of the URL step");
    }
    // The reads waited out the outage (the 32 MiB were not all fetched
    // before it): each task's read began when it went down and took most
    // of its 3 s.
    for i in 0..2 {
        let ms: u64 = fs::read_to_string(out.join(format!("read-ms-{i}")))
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert!(ms >= 2000, "task {i} read everything in {ms} ms: no wait");
        eprintln!("URL step: task {i}'s reads took {ms} ms across a 3 s outage");
    }
    eprintln!("URL step: done {waited:?} after the server went down");
    drop(web);
    assert_nothing_left(&img, uid, &late, "the URL step");

    // 7. The job past its time limit.
    let t0 = Instant::now();
    loop {
        let s = cl.job_state(&timeout_job);
        if s == "TIMEOUT" {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(150),
            "job {timeout_job}: {s}, not TIMEOUT"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let text = fs::read_to_string(out.join("timeout.out")).unwrap_or_default();
    assert!(
        text.contains("README") && text.contains("DUE TO TIME LIMIT"),
        "{text}"
    );
    assert_nothing_left(
        &img,
        uid,
        Path::new("/nothing"),
        "the job past its time limit",
    );
    drop(cl);
    let ns = run_cmd(Command::new("ip").args(["netns", "list"]))
        .ok()
        .text();
    assert!(
        !ns.lines().any(|l| l.starts_with("sl-")),
        "namespaces left: {ns}"
    );
    eprintln!("all in {:?}", started.elapsed());
}
