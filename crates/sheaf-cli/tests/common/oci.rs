//! Container image fixtures: a rootfs of host programs and the OCI layout
//! tests/support/mkoci.py writes from it.

use super::prerequisite;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A rootfs of a few host programs and the libraries they load, so
/// commands run inside images.
pub fn base_rootfs(root: &Path) {
    for prog in [
        "/bin/sh",
        "/bin/cat",
        "/bin/ls",
        "/usr/bin/env",
        "/usr/bin/id",
        "/bin/sleep",
    ] {
        let mut files = vec![PathBuf::from(prog)];
        let o = Command::new("ldd").arg(prog).output().unwrap();
        for w in String::from_utf8_lossy(&o.stdout).split_whitespace() {
            if w.starts_with('/') {
                files.push(PathBuf::from(w));
            }
        }
        for f in files {
            let dest = root.join(f.strip_prefix("/").unwrap());
            fs::create_dir_all(dest.parent().unwrap()).unwrap();
            if !dest.exists() {
                fs::copy(fs::canonicalize(&f).unwrap(), &dest).unwrap();
            }
        }
    }
}

pub struct Layout {
    pub dir: PathBuf,
    pub summary: serde_json::Value,
}

/// The test layout (tags gz, zst, arm, multi, extra), in `t/lay`.
pub fn layout(t: &Path) -> Layout {
    assert!(prerequisite(
        Command::new("zstd").arg("--version").output().is_ok(),
        "zstd"
    ));
    let base = t.join("base");
    base_rootfs(&base);
    let dir = t.join("lay");
    let o = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/mkoci.py"))
        .arg(&dir)
        .arg(&base)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "mkoci.py: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    Layout {
        dir,
        summary: serde_json::from_slice(&o.stdout).unwrap(),
    }
}

impl Layout {
    pub fn oci(&self, tag: &str) -> String {
        format!("oci:{}:{tag}", self.dir.display())
    }
    pub fn strs(&self, key: &str) -> Vec<String> {
        self.summary[key]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }
    pub fn manifest(&self, tag: &str) -> String {
        self.summary["manifests"][tag].as_str().unwrap().to_string()
    }
    pub fn blob_path(&self, digest: &str) -> PathBuf {
        self.dir.join("blobs/sha256").join(&digest[7..])
    }
}

pub fn have(prog: &str) -> bool {
    prerequisite(
        Command::new(server_program(prog))
            .arg("--help")
            .output()
            .is_ok(),
        prog,
    )
}

pub fn server_program(p: &str) -> PathBuf {
    super::servers::program(p)
}
