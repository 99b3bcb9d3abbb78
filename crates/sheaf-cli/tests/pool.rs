//! Software pools with real Lmod (Debian's `lmod`), real FUSE mounts and a
//! compiled program: build, load through the shell-init function, module
//! avail/load, run, unload; failures leave MODULEPATH alone; an unchanged
//! package keeps its blocks across pool versions.

mod common;
use common::servers::Nginx;
use common::*;
use std::path::Path;
use std::process::Command;

const LMOD_INIT: &str = "/usr/share/lmod/lmod/init/bash";

/// A pool: `tool/2.0` (a compiled C program), `pyfoo/1.0` (a Python
/// package), `zlib-data/1.0` (many small files, no modulefile change).
fn make_pool(dir: &Path, tool_message: &str) {
    let sheaf_init = sheaf(["pool".as_ref(), "init".as_ref(), dir.as_os_str()]);
    sheaf_init.ok();
    // The compiled program.
    let bin = dir.join("install/tool/2.0/bin");
    std::fs::create_dir_all(&bin).unwrap();
    let c = dir.join("source/tool.c");
    write(
        &c,
        format!("#include <stdio.h>\nint main(void) {{ puts(\"{tool_message}\"); return 0; }}\n")
            .as_bytes(),
    );
    let st = Command::new("cc")
        .arg("-O1")
        .arg("-o")
        .arg(bin.join("tool"))
        .arg(&c)
        .status()
        .unwrap();
    assert!(st.success());
    std::fs::create_dir_all(dir.join("modulefiles/tool")).unwrap();
    write(
        &dir.join("modulefiles/tool/2.0.lua"),
        b"local root = myFileName():match(\"(.*)/modulefiles/\")\n\
          prepend_path(\"PATH\", pathJoin(root, \"install/tool/2.0/bin\"))\n",
    );
    // The Python package.
    let py = dir.join("install/pyfoo/1.0/lib/pyfoo");
    std::fs::create_dir_all(&py).unwrap();
    write(&py.join("__init__.py"), b"ANSWER = 42\n");
    std::fs::create_dir_all(dir.join("modulefiles/pyfoo")).unwrap();
    write(
        &dir.join("modulefiles/pyfoo/1.0.lua"),
        b"local root = myFileName():match(\"(.*)/modulefiles/\")\n\
          prepend_path(\"PYTHONPATH\", pathJoin(root, \"install/pyfoo/1.0/lib\"))\n",
    );
    // Many small files that do not change between versions.
    let data = dir.join("install/zlib-data/1.0/share");
    std::fs::create_dir_all(&data).unwrap();
    let mut rng = Rng::new(11);
    for i in 0..400 {
        write(&data.join(format!("f{i:03}.txt")), &rng.text(1500));
    }
    std::fs::create_dir_all(dir.join("modulefiles/zlib-data")).unwrap();
    write(
        &dir.join("modulefiles/zlib-data/1.0.lua"),
        b"local root = myFileName():match(\"(.*)/modulefiles/\")\n\
          setenv(\"ZDATA\", pathJoin(root, \"install/zlib-data/1.0/share\"))\n",
    );
}

/// `DIR/demo.sheaf`: [`make_pool`]'s pool built `--name demo/1.0`.
fn demo_pool(dir: &Path) -> std::path::PathBuf {
    let pool = dir.join("pool");
    make_pool(&pool, "demo says hi");
    let img = dir.join("demo.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--name".as_ref(),
        "demo/1.0".as_ref(),
        "-q".as_ref(),
    ])
    .ok();
    img
}

fn bash(script: &str, env: &[(&str, &Path)]) -> Out {
    let mut c = Command::new("bash");
    c.arg("-c").arg(script).env_remove("MODULEPATH");
    for (k, v) in env {
        c.env(k, v);
    }
    run_cmd(&mut c)
}

#[test]
fn a_pool_loads_into_lmod_runs_and_unloads_and_failure_changes_nothing() {
    if !mounts_allowed() {
        return;
    }
    assert!(
        Path::new(LMOD_INIT).exists(),
        "Lmod missing: `make test` installs lmod"
    );
    let t = tmpdir();
    let pool = t.path().join("pool");
    make_pool(&pool, "tool 2.0 says hi");
    let shared = t.path().join("shared/sw");
    std::fs::create_dir_all(&shared).unwrap();
    let img = shared.join("1.0.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--name".as_ref(),
        "sw/1.0".as_ref(),
    ])
    .ok();
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"{s}\"]\nlocal = \"{l}\"\nmounts = \"{m}\"\n",
            s = t.path().join("shared").display(),
            l = t.path().join("local").display(),
            m = t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let mp = t.path().join("mnt/sw/1.0");
    let script = format!(
        "set -u\nsource {LMOD_INIT}\nexport MODULEPATH=/nonexistent/site\n\
         eval \"$({bin} shell-init bash)\"\n\
         before=\"$MODULEPATH\"\n\
         if sheaf pool load sw/9.9 2>/dev/null; then echo LOAD-OF-MISSING-SUCCEEDED; fi\n\
         [ \"$MODULEPATH\" = \"$before\" ] && echo MODULEPATH-UNCHANGED\n\
         sheaf pool load sw/1.0 || exit 3\n\
         echo \"MP=$MODULEPATH\"\n\
         module -t avail 2>&1 | sed 's/^/AVAIL /'\n\
         module load tool/2.0 pyfoo/1.0 || exit 4\n\
         tool\n\
         python3 -c 'import pyfoo; print(\"PY\", pyfoo.ANSWER)'\n\
         sheaf pool list\n\
         sheaf pool unload sw/1.0 || exit 5\n\
         echo \"AFTER=$MODULEPATH\"\n\
         command -v tool || echo TOOL-GONE\n\
         echo \"LOADED=${{LOADEDMODULES:-}}\"\n",
        bin = bin()
    );
    let o = bash(&script, &[("SHEAF_CONFIG", &conf)]);
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    let desc = format!("{}\nstdout:\n{out}", o.describe());
    assert_eq!(o.code, 0, "{desc}");
    assert!(!out.contains("LOAD-OF-MISSING-SUCCEEDED"), "{desc}");
    assert!(out.contains("MODULEPATH-UNCHANGED"), "{desc}");
    assert!(
        out.contains(&format!(
            "MP={}/modulefiles:/nonexistent/site",
            mp.display()
        )),
        "{desc}"
    );
    for m in ["tool/2.0", "pyfoo/1.0", "zlib-data/1.0", "hello/1.0"] {
        assert!(out.contains(&format!("AVAIL {m}")), "{m}: {desc}");
    }
    assert!(out.contains("tool 2.0 says hi"), "{desc}");
    assert!(out.contains("PY 42"), "{desc}");
    assert!(out.contains("mounted at"), "{desc}");
    assert!(out.contains("AFTER=/nonexistent/site"), "{desc}");
    assert!(out.contains("TOOL-GONE"), "{desc}");
    assert!(
        out.contains("LOADED=\n") || out.trim_end().ends_with("LOADED="),
        "{desc}"
    );
    assert!(!is_mounted(&mp), "unload left the pool mounted");
    // The node-local copy is the shared image, byte for byte.
    assert_eq!(
        std::fs::read(t.path().join("local/sw/1.0.sheaf")).unwrap(),
        std::fs::read(&img).unwrap()
    );
}

#[test]
fn an_unchanged_package_keeps_its_blocks_in_the_next_pool_version() {
    let t = tmpdir();
    let pool = t.path().join("pool");
    make_pool(&pool, "v1");
    let build_pool = |out: &Path| {
        sheaf([
            "pool".as_ref(),
            "build".as_ref(),
            pool.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
            "--name".as_ref(),
            "sw/x".as_ref(),
            "--force".as_ref(),
        ])
        .ok();
    };
    let (p1, p2) = (t.path().join("p1.sheaf"), t.path().join("p2.sheaf"));
    let (b1, b2) = (t.path().join("b1.sheaf"), t.path().join("b2.sheaf"));
    build_pool(&p1);
    build(&pool, &b1, &[]);
    // Version 2: the first package in packing order grows a file.
    let extra = pool.join("install/hello/1.0/share");
    std::fs::create_dir_all(&extra).unwrap();
    write(&extra.join("NEWS"), &Rng::new(5).text(3000));
    build_pool(&p2);
    build(&pool, &b2, &[]);
    let (pool_new, pool_total) = new_object_bytes(&p1, &p2);
    let (plain_new, _) = new_object_bytes(&b1, &b2);
    // The pool packs each package apart: the unchanged 600 KB of small
    // files keep their blocks. A plain build shifts them.
    assert!(
        (pool_new as f64) < 0.25 * pool_total as f64,
        "pool: {pool_new} new of {pool_total}"
    );
    assert!(
        pool_new * 2 < plain_new,
        "pool build {pool_new} new bytes vs plain build {plain_new}"
    );
    // A broken layout is refused with one line naming the file.
    std::fs::remove_dir_all(pool.join("install/pyfoo")).unwrap();
    let o = sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        t.path().join("bad.sheaf").as_os_str(),
        "--name".as_ref(),
        "sw/x".as_ref(),
    ])
    .fails_with(1);
    assert!(
        o.one_err_line().contains("pyfoo/1.0.lua"),
        "{}",
        o.describe()
    );
    assert!(!t.path().join("bad.sheaf").exists());
}

#[test]
fn under_mpirun_every_rank_loads_the_pool_and_the_node_mounts_it_once() {
    if !mounts_allowed() || !prerequisite(is_root(), "root (mpirun --allow-run-as-root)") {
        return;
    }
    let t = tmpdir();
    let pool = t.path().join("pool");
    sheaf(["pool".as_ref(), "init".as_ref(), pool.as_os_str()]).ok();
    std::fs::create_dir_all(t.path().join("shared/p")).unwrap();
    let img = t.path().join("shared/p/1.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--name".as_ref(),
        "p/1".as_ref(),
    ])
    .ok();
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"{}\"]\nlocal = \"{}\"\nmounts = \"{}\"\n",
            t.path().join("shared").display(),
            t.path().join("local").display(),
            t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let mp = t.path().join("mnt/p/1");
    let mounts_at = || {
        std::fs::read_to_string("/proc/self/mounts")
            .unwrap()
            .lines()
            .filter(|l| l.split(' ').nth(1) == Some(mp.to_str().unwrap()))
            .count()
    };
    for round in 0..2 {
        let o = run_cmd(
            Command::new("mpirun")
                .args(["--allow-run-as-root", "--oversubscribe", "-np", "3"])
                .args([
                    "--mca",
                    "btl",
                    "self,vader",
                    "--mca",
                    "oob_tcp_if_include",
                    "lo",
                ])
                .arg(bin())
                .args(["pool", "load", "p/1", "--sh"])
                .env("SHEAF_CONFIG", &conf),
        );
        assert_eq!(o.code, 0, "round {round}: {}", o.describe());
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(out.matches("module use").count(), 3, "{out}");
        assert_eq!(
            mounts_at(),
            1,
            "round {round}: mounted {} times",
            mounts_at()
        );
    }
    let _guard = Mounted::adopt(&mp);
    assert_eq!(
        std::fs::read(t.path().join("local/p/1.sheaf")).unwrap(),
        std::fs::read(&img).unwrap()
    );
}

/// The string fields `keys` of every object in the JSON array `v`, sorted.
fn fields(v: &serde_json::Value, keys: &[&str]) -> Vec<Vec<String>> {
    let mut rows: Vec<Vec<String>> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|o| {
            keys.iter()
                .map(|k| o[k].as_str().unwrap().to_string())
                .collect()
        })
        .collect();
    rows.sort();
    rows
}

/// A pool location served by a real nginx: `pool publish` writes a
/// repository and the catalogue; `pool avail` lists the URL location (and
/// warns about one without a catalogue); `pool load NAME/VERSION` finds the
/// pool there, brings it over HTTP, mounts it and the program runs; a
/// second version publishes only what changed.
#[test]
fn pools_published_to_a_web_location_are_listed_and_load_over_http() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let pool = t.path().join("pool");
    make_pool(&pool, "tool from the web");
    let built = t.path().join("build/sw/1.0.sheaf");
    std::fs::create_dir_all(built.parent().unwrap()).unwrap();
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        built.as_os_str(),
        "--name".as_ref(),
        "sw/1.0".as_ref(),
    ])
    .ok();
    let www = t.path().join("www");
    let loc = www.join("pools");
    // Name from the path (.../sw/1.0.sheaf).
    let p1 = json(
        &sheaf([
            "pool".as_ref(),
            "publish".as_ref(),
            "--json".as_ref(),
            built.as_os_str(),
            loc.as_os_str(),
        ])
        .ok(),
    );
    assert_eq!(p1["pool"], "sw/1.0", "{p1}");
    let v1_objects = p1["objects_written"].as_u64().unwrap();
    assert!(v1_objects > 0, "{p1}");
    // A plain image file in the location too; then only the catalogue.
    std::fs::create_dir_all(loc.join("other")).unwrap();
    std::fs::copy(&built, loc.join("other/2.sheaf")).unwrap();
    sheaf(["pool".as_ref(), "publish".as_ref(), loc.as_os_str()]).ok();
    // The catalogue, read as plain JSON: both pools, relative sources.
    let cat: serde_json::Value =
        serde_json::from_slice(&std::fs::read(loc.join("pools.json")).unwrap()).unwrap();
    assert_eq!(
        fields(&cat["pools"], &["pool", "form", "source"]),
        vec![
            vec!["other/2", "image", "other/2.sheaf"],
            vec!["sw/1.0", "repository", "sw/1.0"],
        ]
    );
    assert!(loc.join("sw/objects").is_dir());

    let web = Nginx::start_with_root(&t.path().join("nginx"), &www);
    let url = web.url("pools");
    std::fs::create_dir_all(www.join("empty")).unwrap();
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"{url}\", \"{bare}\"]\nlocal = \"{l}\"\nmounts = \"{m}\"\n",
            bare = web.url("empty"),
            l = t.path().join("local").display(),
            m = t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let with_conf = |args: &[&str]| {
        let mut c = cmd();
        c.args(args).env("SHEAF_CONFIG", &conf);
        run_cmd(&mut c)
    };
    let av = with_conf(&["pool", "avail", "--json"]).ok();
    let offers = json(&av);
    assert_eq!(
        fields(&offers, &["pool", "source"]),
        vec![
            vec!["other/2".to_string(), format!("{url}/other/2.sheaf")],
            vec!["sw/1.0".to_string(), format!("{url}/sw/1.0")],
        ],
        "{}",
        av.describe()
    );
    assert!(
        av.stderr.contains(&web.url("empty")) && av.stderr.contains("no pools.json"),
        "{}",
        av.describe()
    );

    // Load by name: found in the URL location's catalogue, brought over HTTP.
    let mp = t.path().join("mnt/sw/1.0");
    let o = with_conf(&["pool", "load", "sw/1.0", "--sh"]);
    let _guard = Mounted::adopt(&mp);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(o.text().contains("module use"), "{}", o.describe());
    let ran = run_cmd(&mut Command::new(mp.join("install/tool/2.0/bin/tool"))).ok();
    assert_eq!(ran.text().trim(), "tool from the web");
    assert_eq!(
        std::fs::read(t.path().join("local/sw/1.0.sheaf")).unwrap(),
        std::fs::read(&built).unwrap(),
        "the node-local copy of a published pool is the built image"
    );
    // A name no location offers: one line naming it.
    let miss = with_conf(&["pool", "load", "sw/9.9", "--sh"]);
    assert_ne!(miss.code, 0);
    assert!(miss.stderr.contains("sw/9.9"), "{}", miss.describe());
    sheaf(["umount".as_ref(), mp.as_os_str()]).ok();

    // Version 2, one file changed: publishing writes only what changed.
    write(
        &pool.join("install/pyfoo/1.0/lib/pyfoo/__init__.py"),
        b"ANSWER = 43\n",
    );
    let built2 = t.path().join("build/sw/2.0.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        built2.as_os_str(),
        "--name".as_ref(),
        "sw/2.0".as_ref(),
    ])
    .ok();
    let p2 = json(
        &sheaf([
            "pool".as_ref(),
            "publish".as_ref(),
            "--json".as_ref(),
            built2.as_os_str(),
            loc.as_os_str(),
        ])
        .ok(),
    );
    let new = p2["objects_written"].as_u64().unwrap();
    let reused = p2["objects_reused"].as_u64().unwrap();
    // Expected from the two images' object lists: v2's distinct objects
    // that v1 lacks are written, the rest are already there.
    let hashes = |p: &Path| -> std::collections::BTreeSet<[u8; 32]> {
        image_objects(p).into_iter().map(|o| o.0).collect()
    };
    let (h1, h2) = (hashes(&built), hashes(&built2));
    assert_eq!(v1_objects, h1.len() as u64, "{p1}");
    assert_eq!(new, h2.difference(&h1).count() as u64, "{p2}");
    assert_eq!(reused, h2.intersection(&h1).count() as u64, "{p2}");
    assert!(new < reused, "v2 wrote {new} objects, reused {reused}");
    let av2 = json(&with_conf(&["pool", "avail", "--json"]).ok());
    assert!(
        av2.as_array()
            .unwrap()
            .iter()
            .any(|o| o["pool"] == "sw/2.0"),
        "{av2}"
    );
}

/// Two simulated nodes (each a persistent mount + UTS namespace with its
/// own host name, node-local directory and mount directory), two ranks on
/// each: `mpirun -np 4 sheaf pool load` broadcasts once and every node
/// mounts the pool once, at the same path, and runs its program.
#[test]
fn under_mpirun_two_nodes_each_mount_the_pool_once_at_the_same_path() {
    if !mounts_allowed()
        || !prerequisite(is_root(), "root (namespaces, mpirun --allow-run-as-root)")
    {
        return;
    }
    let t = tmpdir();
    let pool = t.path().join("pool");
    make_pool(&pool, "tool on every node");
    std::fs::create_dir_all(t.path().join("shared/p")).unwrap();
    let img = t.path().join("shared/p/1.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--name".as_ref(),
        "p/1".as_ref(),
    ])
    .ok();
    let (local, mounts) = (t.path().join("local"), t.path().join("mnt"));
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"{}\"]\nlocal = \"{}\"\nmounts = \"{}\"\n",
            t.path().join("shared").display(),
            local.display(),
            mounts.display()
        )
        .as_bytes(),
    );
    // Persistent namespaces need their files on a private mount.
    let ns = t.path().join("ns");
    std::fs::create_dir_all(&ns).unwrap();
    let sh = |script: &str| {
        let o = run_cmd(Command::new("sh").arg("-c").arg(script));
        assert_eq!(o.code, 0, "{script}: {}", o.describe());
        o
    };
    sh(&format!(
        "mount --bind {n} {n} && mount --make-private {n}",
        n = ns.display()
    ));
    struct Nodes(std::path::PathBuf, Vec<std::path::PathBuf>);
    impl Drop for Nodes {
        fn drop(&mut self) {
            // Unmount the pools inside each node, then the namespaces.
            for mnt in &self.1 {
                let _ = Command::new("nsenter")
                    .arg(format!("--mount={}", mnt.display()))
                    .args(["sh", "-c", "grep ' fuse.sheaf ' /proc/self/mounts | cut -d' ' -f2 | xargs -r -n1 umount -l"])
                    .status();
                let _ = Command::new("umount").arg(mnt).status();
            }
            for f in ["uts0", "uts1"] {
                let _ = Command::new("umount").arg(self.0.join(f)).status();
            }
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let nodes = Nodes(ns.clone(), vec![ns.join("mnt0"), ns.join("mnt1")]);
    std::fs::create_dir_all(&local).unwrap();
    std::fs::create_dir_all(&mounts).unwrap();
    for n in 0..2 {
        for d in ["local", "mnt"] {
            std::fs::create_dir_all(t.path().join(format!("node{n}/{d}"))).unwrap();
        }
        for f in ["mnt", "uts"] {
            write(&ns.join(format!("{f}{n}")), b"");
        }
        sh(&format!(
            "unshare --mount={ns}/mnt{n} --uts={ns}/uts{n} --propagation private sh -c \
             'hostname simnode{n} && mount --bind {t}/node{n}/local {local} && \
              mount --bind {t}/node{n}/mnt {mounts}'",
            ns = ns.display(),
            t = t.path().display(),
            local = local.display(),
            mounts = mounts.display()
        ));
    }
    let wrapper = t.path().join("node.sh");
    write(
        &wrapper,
        format!(
            "#!/bin/sh\nn=$((OMPI_COMM_WORLD_RANK / 2))\n\
             exec nsenter --mount={ns}/mnt$n --uts={ns}/uts$n -- \"$@\"\n",
            ns = ns.display()
        )
        .as_bytes(),
    );
    chmod(&wrapper, 0o755);
    let o = run_cmd(
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-np", "4"])
            .args([
                "--mca",
                "btl",
                "self,tcp",
                "--mca",
                "btl_tcp_if_include",
                "lo",
            ])
            .args(["--mca", "oob_tcp_if_include", "lo"])
            .arg(&wrapper)
            .arg(bin())
            .args(["pool", "load", "p/1", "--sh"])
            .env("SHEAF_CONFIG", &conf),
    );
    assert_eq!(o.code, 0, "{}", o.describe());
    assert_eq!(
        o.text().matches("module use").count(),
        4,
        "{}",
        o.describe()
    );
    let mp = mounts.join("p/1");
    for n in 0..2 {
        let o = sh(&format!(
            "nsenter --mount={ns}/mnt{n} --uts={ns}/uts{n} sh -c \
             'hostname; grep -c \" {mp} fuse.sheaf \" /proc/self/mounts; {mp}/install/tool/2.0/bin/tool; \
              cmp {img} {local}/p/1.sheaf && echo SAME'",
            ns = ns.display(),
            mp = mp.display(),
            img = img.display(),
            local = local.display()
        ));
        let out = o.text();
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            vec![
                &format!("simnode{n}") as &str,
                "1",
                "tool on every node",
                "SAME"
            ],
            "node {n}: {}",
            o.describe()
        );
    }
    // Nothing leaked into this (the test's) namespace.
    assert!(!is_mounted(&mp));
    assert!(std::fs::read_dir(&local).unwrap().next().is_none());
    drop(nodes);
}

/// `pool load` finds a `fuse.sheaf` mount at its mount point: one made by
/// another local user (even of the very same image), and one of another
/// image made by the user. It uses neither: one line, a non-zero exit, no
/// shell code for Lmod, and the mount left as it was.
#[test]
fn pool_load_never_uses_a_foreign_or_different_mount_at_its_mount_point() {
    if !mounts_allowed() || !prerequisite(is_root(), "root, to create a second user") {
        return;
    }
    let user = "sheaf-pool-other";
    if !Command::new("id")
        .arg(user)
        .output()
        .unwrap()
        .status
        .success()
    {
        run_cmd(Command::new("useradd").args(["--no-create-home", "--shell", "/bin/sh", user]))
            .ok();
    }
    let t = tmpdir();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(t.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let pool = t.path().join("pool");
    make_pool(&pool, "the real tool");
    let shared = t.path().join("shared/sw");
    std::fs::create_dir_all(&shared).unwrap();
    let img = shared.join("1.0.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        pool.as_os_str(),
        "-o".as_ref(),
        img.as_os_str(),
        "--name".as_ref(),
        "sw/1.0".as_ref(),
    ])
    .ok();
    // Another image: same layout, a different tool.
    let evil_pool = t.path().join("evil-pool");
    make_pool(&evil_pool, "an impostor");
    let evil = t.path().join("evil.sheaf");
    sheaf([
        "pool".as_ref(),
        "build".as_ref(),
        evil_pool.as_os_str(),
        "-o".as_ref(),
        evil.as_os_str(),
        "--name".as_ref(),
        "sw/1.0".as_ref(),
    ])
    .ok();
    for p in [&img, &evil] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o644)).unwrap();
    }
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = [\"{s}\"]\nlocal = \"{l}\"\nmounts = \"{m}\"\n",
            s = t.path().join("shared").display(),
            l = t.path().join("local").display(),
            m = t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let mp = t.path().join("mnt/sw/1.0");
    std::fs::create_dir_all(&mp).unwrap();
    for d in [t.path().join("mnt"), t.path().join("mnt/sw")] {
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let load = || {
        let mut c = cmd();
        c.args(["pool", "load", "sw/1.0", "--sh"])
            .env("SHEAF_CONFIG", &conf);
        run_cmd(&mut c)
    };
    // 1. A different image, mounted there by this user.
    let m = mount(&[&evil], &mp, &[]);
    let o = load();
    o.no_panic();
    assert_ne!(o.code, 0, "{}", o.describe());
    assert!(
        o.text().is_empty(),
        "shell code was printed: {}",
        o.describe()
    );
    // (The copy's report line may come first: the node had no copy yet.)
    let errors: Vec<&str> = o
        .err_lines()
        .into_iter()
        .filter(|l| l.starts_with("sheaf: "))
        .collect();
    assert!(
        errors.len() == 1 && errors[0].contains("root digest"),
        "{}",
        o.describe()
    );
    let still = run_cmd(&mut Command::new(mp.join("install/tool/2.0/bin/tool"))).ok();
    assert_eq!(
        still.text().trim(),
        "an impostor",
        "the mount was left alone"
    );
    m.umount();
    // 2. The same image, mounted there by another user.
    run_cmd(Command::new("chown").arg(user).arg(&mp)).ok();
    let dev = std::fs::metadata("/dev/fuse").unwrap().permissions().mode();
    std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(0o666)).unwrap();
    let r = std::panic::catch_unwind(|| {
        let mut c = Command::new("setpriv");
        c.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
            .arg(bin())
            .args(["mount", "-o", "allow_other"])
            .arg(&img)
            .arg(&mp)
            .env("SHEAF_CACHE_DIR", t.path().join("other-cache"));
        let o = run_cmd(&mut c);
        if o.code != 0 {
            // Without user_allow_other in /etc/fuse.conf: a mount only its
            // owner may enter, which is still a foreign mount there.
            let mut c = Command::new("setpriv");
            c.args(["--reuid", user, "--regid", user, "--init-groups", "--"])
                .arg(bin())
                .arg("mount")
                .arg(&img)
                .arg(&mp)
                .env("SHEAF_CACHE_DIR", t.path().join("other-cache"));
            run_cmd(&mut c).ok();
        }
        assert!(is_mounted(&mp));
        let o = load();
        o.no_panic();
        assert_ne!(o.code, 0, "{}", o.describe());
        assert!(
            o.text().is_empty(),
            "shell code was printed: {}",
            o.describe()
        );
        let errors: Vec<&str> = o
            .err_lines()
            .into_iter()
            .filter(|l| l.starts_with("sheaf: "))
            .collect();
        assert!(
            errors.len() == 1 && errors[0].contains("not yours"),
            "{}",
            o.describe()
        );
    });
    std::fs::set_permissions("/dev/fuse", std::fs::Permissions::from_mode(dev)).unwrap();
    let _ = Command::new("umount").arg("-l").arg(&mp).output();
    if let Err(e) = r {
        std::panic::resume_unwind(e);
    }
    // 3. Nothing there: the pool loads, pinned to what was checked.
    let o = load();
    let _guard = Mounted::adopt(&mp);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(o.text().contains("module use"), "{}", o.describe());
    let ran = run_cmd(&mut Command::new(mp.join("install/tool/2.0/bin/tool"))).ok();
    assert_eq!(ran.text().trim(), "the real tool");
}

/// `pool load ./demo.sheaf` of a pool built `--name demo/1.0` mounts it by
/// the name it records, so `pool unload demo/1.0` finds it; unload also
/// takes the file and the mount point. `pool gc --json` says what it
/// removes, keeping the newest version and any mounted one.
#[test]
fn a_pool_file_loads_by_its_recorded_name_and_gc_says_what_it_removes() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let img = demo_pool(t.path());
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = []\nlocal = \"{l}\"\nmounts = \"{m}\"\n",
            l = t.path().join("local").display(),
            m = t.path().join("mnt").display()
        )
        .as_bytes(),
    );
    let mp = t.path().join("mnt/demo/1.0");
    let env = |c: &mut Command| {
        c.env("SHEAF_CONFIG", &conf);
    };
    // Run where the image lies, so that `./demo.sheaf` names it.
    let run = |args: &[&std::ffi::OsStr]| {
        let mut c = cmd();
        env(&mut c);
        run_cmd(c.args(args).current_dir(t.path()))
    };
    let load_as = |arg: &std::ffi::OsStr| {
        let o = run(&["pool".as_ref(), "load".as_ref(), arg]);
        assert_eq!(o.code, 0, "load {arg:?}: {}", o.describe());
        assert!(is_mounted(&mp), "not mounted at {}", mp.display());
        assert!(mp.join("modulefiles/tool/2.0.lua").is_file());
    };
    let load = || load_as(img.as_os_str());
    // `pool load ./demo.sheaf` (a relative path, no NAME/VERSION in it).
    assert_eq!(img, t.path().join("demo.sheaf"));
    load_as("./demo.sheaf".as_ref());
    let o = run(&["pool".as_ref(), "unload".as_ref(), "demo/1.0".as_ref()]);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(!is_mounted(&mp));
    for how in [
        "demo/1.0".into(),
        img.clone().into_os_string(),
        mp.clone().into_os_string(),
    ] {
        load();
        let o = run(&["pool".as_ref(), "unload".as_ref(), how.as_os_str()]);
        assert_eq!(o.code, 0, "unload {how:?}: {}", o.describe());
        assert!(!is_mounted(&mp), "unload {how:?} left the pool mounted");
    }
    // Two older versions beside the loaded one: gc keeps the newest and
    // the mounted one, and removes the oldest.
    let local = t.path().join("local/demo");
    assert!(local.join("1.0.sheaf").is_file());
    for (v, age) in [("0.8", 3000), ("0.9", 2000)] {
        std::fs::copy(local.join("1.0.sheaf"), local.join(format!("{v}.sheaf"))).unwrap();
        let when = std::time::SystemTime::now() - std::time::Duration::from_secs(age);
        let f = std::fs::File::options()
            .write(true)
            .open(local.join(format!("{v}.sheaf")))
            .unwrap();
        f.set_modified(when).unwrap();
    }
    let size = std::fs::metadata(local.join("0.8.sheaf")).unwrap().len();
    load();
    let gc = |dry: bool| {
        let mut a: Vec<&std::ffi::OsStr> = vec!["pool".as_ref(), "gc".as_ref(), "--json".as_ref()];
        if dry {
            a.push("--dry-run".as_ref());
        }
        json(&run(&a).ok())
    };
    let dry = gc(true);
    let removed: Vec<&str> = dry["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["pool"].as_str().unwrap())
        .collect();
    // 1.0 is mounted (kept, but counts as the kept newest), so 0.9 and 0.8 go.
    assert_eq!(removed, ["demo/0.9", "demo/0.8"], "{dry}");
    assert_eq!(dry["freed_bytes"].as_u64().unwrap(), 2 * size, "{dry}");
    assert_eq!(dry["dry_run"].as_bool(), Some(true), "{dry}");
    for (r, v) in dry["removed"]
        .as_array()
        .unwrap()
        .iter()
        .zip(["0.9", "0.8"])
    {
        let path = local.join(format!("{v}.sheaf"));
        assert_eq!(r["path"].as_str(), path.to_str(), "{dry}");
        assert_eq!(r["bytes"].as_u64(), Some(size), "{dry}");
    }
    assert!(
        local.join("0.8.sheaf").is_file(),
        "--dry-run removed a copy"
    );
    let done = gc(false);
    assert_eq!(done["removed"], dry["removed"]);
    assert_eq!(done["dry_run"].as_bool(), Some(false), "{done}");
    assert_eq!(done["freed_bytes"], dry["freed_bytes"]);
    assert!(!local.join("0.8.sheaf").exists() && !local.join("0.9.sheaf").exists());
    assert!(local.join("1.0.sheaf").is_file());
    let o = run(&["pool".as_ref(), "unload".as_ref(), "demo/1.0".as_ref()]);
    assert_eq!(o.code, 0, "{}", o.describe());
}

/// With no `[pools]` directories configured, sheaf's default directory
/// under `$TMPDIR` has a predictable name: another user who makes it first
/// must not get the victim's copies and mount points (and so the
/// modulefiles the victim's Lmod runs). sheaf refuses it in one line and
/// touches nothing in it; made by sheaf, it is 0700 and this user's.
#[test]
fn a_default_pool_directory_made_by_another_user_is_refused() {
    if !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let img = demo_pool(t.path());
    let conf = t.path().join("config.toml");
    write(&conf, b"[pools]\nlocations = []\n");
    let tmp = t.path().join("tmp");
    std::fs::create_dir(&tmp).unwrap();
    chmod(&tmp, 0o1777);
    // SAFETY: getuid has no preconditions.
    let uid = unsafe { libc::getuid() };
    let base = tmp.join(format!("sheaf-pools-{uid}"));
    let run = |args: &[&std::ffi::OsStr]| {
        let mut c = cmd();
        c.env("SHEAF_CONFIG", &conf)
            .env("TMPDIR", &tmp)
            .env_remove("XDG_RUNTIME_DIR");
        run_cmd(c.args(args))
    };
    let load = || run(&["pool".as_ref(), "load".as_ref(), img.as_os_str()]);
    // Made first by someone else (uid 65534), open to all.
    std::fs::create_dir(&base).unwrap();
    chmod(&base, 0o777);
    std::os::unix::fs::chown(&base, Some(65534), Some(65534)).unwrap();
    let o = load();
    assert_eq!(o.code, 1, "{}", o.describe());
    let e = o.one_err_line();
    assert!(
        e.contains("owned by uid 65534") && e.contains("sheaf-pools"),
        "{e}"
    );
    let inside: Vec<_> = std::fs::read_dir(&base)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(inside.is_empty(), "wrote into it: {inside:?} ({e})");
    // Ours but writable by others: refused too.
    std::os::unix::fs::chown(&base, Some(uid), Some(uid)).unwrap();
    let o = load().fails_with(1);
    let e = o.one_err_line();
    assert!(e.contains("writable by others"), "{e}");
    // Another user's link in its place (which they could swap between
    // a check and a use): refused, not followed.
    std::fs::remove_dir(&base).unwrap();
    let elsewhere = t.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    chmod(&elsewhere, 0o700);
    std::os::unix::fs::symlink(&elsewhere, &base).unwrap();
    std::os::unix::fs::lchown(&base, Some(65534), Some(65534)).unwrap();
    let o = load().fails_with(1);
    let e = o.one_err_line();
    assert!(e.contains("owned by uid 65534"), "{e}");
    assert!(std::fs::read_dir(&elsewhere).unwrap().next().is_none());
    // Made by sheaf: 0700, and the pool loads and unloads.
    std::fs::remove_file(&base).unwrap();
    let o = load();
    assert_eq!(o.code, 0, "{}", o.describe());
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&base).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o700);
    let mp = base.join("mnt/demo/1.0");
    assert!(is_mounted(&mp), "not mounted at {}", mp.display());
    let o = run(&["pool".as_ref(), "unload".as_ref(), "demo/1.0".as_ref()]);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(!is_mounted(&mp));
}

/// Root's `pool load` where the site says `[mount] kernel = "require"`:
/// the pool is the kernel's EROFS mount (its modulefiles there), a second
/// load finds it and uses it (its source names the pool's root digest),
/// and `pool unload` takes it down.
#[test]
fn root_pool_load_takes_the_kernel_path_when_the_site_says_so() {
    if !prerequisite(is_root(), "root (the kernel path mounts EROFS)") || !mounts_allowed() {
        return;
    }
    let t = tmpdir();
    let img = demo_pool(t.path());
    let conf = t.path().join("config.toml");
    write(
        &conf,
        format!(
            "[pools]\nlocations = []\nlocal = \"{l}\"\nmounts = \"{m}\"\n\n[mount]\nkernel = \"require\"\nkernel_cache = \"{k}\"\n",
            l = t.path().join("local").display(),
            m = t.path().join("mnt").display(),
            k = t.path().join("kcache").display(),
        )
        .as_bytes(),
    );
    let mp = t.path().join("mnt/demo/1.0");
    // A failing assertion below still takes the mount down.
    let _guard = Mounted::adopt(&mp);
    let run = |args: &[&std::ffi::OsStr]| {
        let mut c = cmd();
        c.env("SHEAF_CONFIG", &conf);
        run_cmd(c.args(args))
    };
    let fstype = |mp: &Path| {
        let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let mp = mp.canonicalize().unwrap();
        info.lines()
            .find_map(|l| {
                let (left, right) = l.split_once(" - ")?;
                (left.split(' ').nth(4)? == mp.to_str()?)
                    .then(|| right.split(' ').next().unwrap_or("").to_string())
            })
            .unwrap_or_default()
    };
    for _ in 0..2 {
        let o = run(&["pool".as_ref(), "load".as_ref(), img.as_os_str()]);
        assert_eq!(o.code, 0, "{}", o.describe());
        assert!(is_mounted(&mp));
        assert_eq!(fstype(&mp), "erofs");
        assert!(mp.join("modulefiles/tool/2.0.lua").is_file());
    }
    let o = run(&["pool".as_ref(), "unload".as_ref(), "demo/1.0".as_ref()]);
    assert_eq!(o.code, 0, "{}", o.describe());
    assert!(!is_mounted(&mp));
    // An unknown key of [mount] is a refusal naming it, not silence.
    let text = std::fs::read_to_string(&conf).unwrap();
    write(&conf, text.replace("kernel =", "kernell =").as_bytes());
    let o = run(&["pool".as_ref(), "load".as_ref(), img.as_os_str()]);
    assert_eq!(o.code, 1, "{}", o.describe());
    let last = o.err_lines().last().copied().unwrap_or_default();
    assert!(
        last.starts_with("sheaf: error: ")
            && last.ends_with("[mount] kernell: unknown (kernel and kernel_cache are known)"),
        "{}",
        o.describe()
    );
    assert!(!is_mounted(&mp));
}
