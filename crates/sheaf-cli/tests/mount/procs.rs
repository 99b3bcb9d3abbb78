//! Processes as /proc shows them: the servers of a mount, and processes
//! by name (mount.rs's tests of what runs and what is left running).

use std::fs;
use std::path::Path;

/// A process as /proc shows it: pid, parent, name (`comm`), arguments,
/// whether a zombie.
pub struct Proc {
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    pub args: Vec<Vec<u8>>,
    pub zombie: bool,
}

pub fn procs() -> impl Iterator<Item = Proc> {
    fs::read_dir("/proc").unwrap().flatten().filter_map(|e| {
        let pid = e.file_name().to_string_lossy().parse::<u32>().ok()?;
        let cl = fs::read(e.path().join("cmdline")).ok()?;
        let args = cl
            .split(|&b| b == 0)
            .filter(|a| !a.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // "pid (comm) state ...": comm may hold spaces and parentheses.
        let (head, rest) = stat.rsplit_once(')')?;
        let comm = head.split_once('(')?.1.to_string();
        let zombie = rest.trim_start().starts_with('Z');
        let ppid = rest.split_whitespace().nth(1)?.parse().ok()?;
        Some(Proc {
            pid,
            ppid,
            comm,
            args,
            zombie,
        })
    })
}

/// Process ids of `sheaf mount` processes serving `mp`.
pub fn servers(mp: &Path) -> Vec<u32> {
    let mp_s = mp.as_os_str().as_encoded_bytes();
    let found: Vec<Proc> = procs()
        .filter(|p| {
            // A root mount's watchdog is a fork of its server (same command
            // line); it names itself just after the fork, so a fresh one is
            // known by its parent below.
            !p.zombie
                && p.comm != "sheaf-watchdog"
                && p.args.iter().any(|a| a == b"mount")
                && p.args
                    .iter()
                    .any(|a| a.ends_with(mp_s) || mp_s.ends_with(a))
                && p.args.first().is_some_and(|a| a.ends_with(b"sheaf"))
        })
        .collect();
    found
        .iter()
        .filter(|p| !found.iter().any(|q| q.pid == p.ppid))
        .map(|p| p.pid)
        .collect()
}

/// Pids of processes named `comm` whose command line mentions `mp`.
pub fn named(comm: &str, mp: &Path) -> Vec<u32> {
    let mp = mp.as_os_str().as_encoded_bytes();
    procs()
        .filter(|p| p.comm == comm && p.args.iter().any(|a| a == mp))
        .map(|p| p.pid)
        .collect()
}
