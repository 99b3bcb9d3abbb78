//! The simulated cluster's smoke run (bench/cluster.sh with N = 1 and 4):
//! network namespaces on a bridge, a real nginx origin and a real squid in
//! namespaces of their own, each node mounting tree P's repository through
//! squid and importing numpy, scipy and pandas cold at once. What the
//! origin sends for 4 nodes stays within 1.1x of what it sends for one.
//! Then the broadcast part: `sheaf bcast` and the sw-pool method under a
//! real mpirun to 4 namespaced nodes over MPI TCP on the bridge; the script
//! compares every node's copy with the source, and sheaf reads the image
//! from shared storage once.

mod common;
use common::*;
use std::path::Path;

#[test]
fn four_namespaced_nodes_read_the_origin_about_once() {
    if !prerequisite(is_root(), "root, for network namespaces") {
        return;
    }
    let Some(p) = real_tree("P") else { return };
    let t = tmpdir();
    let out = t.path().join("cluster.md");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../bench/cluster.sh");
    let o = run_cmd(
        std::process::Command::new("bash")
            .arg(&script)
            .env("NODES", "1 4")
            .env("DELAYS", "0")
            .env("PARTS", "fanout bcast")
            .env("BNODES", "4")
            .env("BRATES", "1gbit")
            .env("SIZE_MB", "32")
            .env("BIMAGES", "random")
            .env("CLUSTER_OUT", &out)
            .env("SHEAF", bin())
            .env("SHEAF_BENCH_DATA", p.parent().unwrap()),
    );
    assert_eq!(o.code, 0, "{}", o.describe());
    let table = std::fs::read_to_string(&out).unwrap();
    // | delay | N | origin bytes | ... rows, N = 1 then 4.
    let bytes: Vec<(u64, f64)> = table
        .lines()
        .filter(|l| l.starts_with("| 0 |"))
        .map(|l| {
            let c: Vec<&str> = l.split('|').map(str::trim).collect();
            (c[2].parse().unwrap(), c[3].parse().unwrap())
        })
        .collect();
    assert_eq!(bytes.len(), 2, "{table}");
    assert_eq!(bytes[0].0, 1);
    let (one, four) = (bytes[0].1, bytes[1].1);
    assert!(one > 1e6, "one node fetched only {one} bytes: {table}");
    assert!(
        four <= 1.1 * one,
        "4 nodes: {four} bytes from the origin, one: {one}\n{table}"
    );
    // | image | rate | N | sw-pool s | sheaf s | ratio | read: sw-pool | sheaf |
    let bcast: Vec<Vec<&str>> = table
        .lines()
        .filter(|l| l.starts_with("| random ("))
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(bcast.len(), 1, "{table}");
    let read: f64 = bcast[0][8].parse().unwrap();
    assert!(
        (1.0..1.01).contains(&read),
        "sheaf bcast read {read}x the image from shared storage\n{table}"
    );
    // Nothing left behind: namespaces and mounts.
    let ns = run_cmd(std::process::Command::new("ip").args(["netns", "list"]))
        .ok()
        .text();
    assert!(!ns.contains("sc-"), "namespaces left: {ns}");
    let links = run_cmd(std::process::Command::new("ip").args(["link", "show"]))
        .ok()
        .text();
    assert!(
        !links.contains("sc-host"),
        "the host's bridge link was left: {links}"
    );
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains("/cluster."), "mounts left: {mounts}");
}
