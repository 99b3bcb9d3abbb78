//! What an image's config asks of a run: the process (entrypoint, command,
//! environment, working directory, user). Pure: `sheaf run --image` applies
//! it.

use crate::error::{OciError, Result};
use oci_spec::image::ImageConfiguration;

/// The PATH a container gets when its config sets none (Docker's default).
pub const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The process an image describes.
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Process {
    /// Entrypoint followed by Cmd (what runs when the user gives no command).
    pub default_command: Vec<String>,
    /// `KEY=VALUE` pairs, PATH always among them.
    pub env: Vec<(String, String)>,
    /// The working directory (`/` when unset).
    pub working_dir: String,
    /// The config's `User` (`""`: unset), as `USER[:GROUP]`, names or ids.
    pub user: String,
}

impl Process {
    /// Read an image config.
    pub fn from_config(bytes: &[u8]) -> Result<Process> {
        let cfg: ImageConfiguration = serde_json::from_slice(bytes)
            .map_err(|e| OciError::bad("image config", e.to_string()))?;
        let Some(c) = cfg.config() else {
            return Ok(Process {
                env: vec![("PATH".into(), DEFAULT_PATH.into())],
                working_dir: "/".into(),
                ..Default::default()
            });
        };
        let mut default_command: Vec<String> = c.entrypoint().clone().unwrap_or_default();
        default_command.extend(c.cmd().clone().unwrap_or_default());
        let mut env: Vec<(String, String)> = Vec::new();
        for kv in c.env().clone().unwrap_or_default() {
            let (k, v) = kv.split_once('=').unwrap_or((&kv, ""));
            env.retain(|(n, _)| n != k);
            env.push((k.to_string(), v.to_string()));
        }
        if !env.iter().any(|(k, _)| k == "PATH") {
            env.push(("PATH".into(), DEFAULT_PATH.into()));
        }
        let wd = c.working_dir().clone().unwrap_or_default();
        Ok(Process {
            default_command,
            env,
            working_dir: if wd.is_empty() { "/".into() } else { wd },
            user: c.user().clone().unwrap_or_default(),
        })
    }

    /// The environment the command gets: the config's Env, then each
    /// `VAR=VALUE` of `set` (replacing), then `HOME`, `TERM` and `USER`
    /// from `host` where neither set them.
    pub fn environment(
        &self,
        set: &[String],
        host: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>> {
        let mut env = self.env.clone();
        for kv in set {
            let (k, v) = kv
                .split_once('=')
                .ok_or_else(|| OciError::bad(format!("--env {kv}"), "expected VAR=VALUE"))?;
            env.retain(|(n, _)| n != k);
            env.push((k.to_string(), v.to_string()));
        }
        for k in ["HOME", "TERM", "USER"] {
            if let (Some(v), false) = (host(k), env.iter().any(|(n, _)| n == k)) {
                env.push((k.to_string(), v));
            }
        }
        Ok(env)
    }

    /// The value of `key` in the environment.
    pub fn var(&self, key: &str) -> Option<&str> {
        self.env
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// Resolve a config `User` (`NAME|UID[:GROUP|GID]`) against the image's
/// `/etc/passwd` and `/etc/group` texts: the uid and gid it means. Empty
/// means unset (`None`).
pub fn resolve_user(user: &str, passwd: &str, group: &str) -> Result<Option<(u32, u32)>> {
    if user.is_empty() {
        return Ok(None);
    }
    let (u, g) = match user.split_once(':') {
        Some((u, g)) => (u, Some(g)),
        None => (user, None),
    };
    let field = |text: &str, name: &str, idx: usize| -> Option<Vec<String>> {
        text.lines()
            .map(|l| l.split(':').map(str::to_string).collect::<Vec<_>>())
            .find(|f| f.len() > idx && (f[0] == name))
    };
    let (uid, primary) = match u.parse::<u32>() {
        Ok(n) => (
            n,
            passwd
                .lines()
                .map(|l| l.split(':').collect::<Vec<_>>())
                .find(|f| f.len() > 3 && f[2] == u)
                .and_then(|f| f[3].parse().ok())
                .unwrap_or(n),
        ),
        Err(_) => {
            let f = field(passwd, u, 3).ok_or_else(|| {
                OciError::bad(
                    "image config",
                    format!("User {user}: no user {u} in the image's /etc/passwd"),
                )
            })?;
            (
                f[2].parse()
                    .map_err(|_| OciError::bad("/etc/passwd", format!("bad uid for {u}")))?,
                f[3].parse()
                    .map_err(|_| OciError::bad("/etc/passwd", format!("bad gid for {u}")))?,
            )
        }
    };
    let gid = match g {
        None => primary,
        Some(g) => match g.parse::<u32>() {
            Ok(n) => n,
            Err(_) => field(group, g, 2)
                .and_then(|f| f[2].parse().ok())
                .ok_or_else(|| {
                    OciError::bad(
                        "image config",
                        format!("User {user}: no group {g} in the image's /etc/group"),
                    )
                })?,
        },
    };
    Ok(Some((uid, gid)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entrypoint_then_cmd_env_last_wins_and_a_default_path() {
        let p = Process::from_config(
            br#"{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]},
                "config":{"Entrypoint":["/bin/sh","-c"],"Cmd":["echo hi"],"Env":["A=1","A=2","B=x=y"],"WorkingDir":"/srv","User":"app"}}"#,
        )
        .unwrap();
        assert_eq!(p.default_command, ["/bin/sh", "-c", "echo hi"]);
        assert_eq!(p.var("A"), Some("2"));
        assert_eq!(p.var("B"), Some("x=y"));
        assert_eq!(p.var("PATH"), Some(DEFAULT_PATH));
        assert_eq!(p.working_dir, "/srv");
        assert_eq!(p.user, "app");
    }

    #[test]
    fn set_variables_replace_and_host_ones_only_fill_in() {
        let p = Process {
            env: vec![
                ("PATH".into(), "/bin".into()),
                ("HOME".into(), "/root".into()),
            ],
            ..Default::default()
        };
        let host = |k: &str| Some(format!("host-{k}"));
        let env = p
            .environment(&["PATH=/x".into(), "A=b=c".into()], host)
            .unwrap();
        assert_eq!(
            env,
            [
                ("HOME", "/root"),
                ("PATH", "/x"),
                ("A", "b=c"),
                ("TERM", "host-TERM"),
                ("USER", "host-USER"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string()))
        );
        assert!(p.environment(&["NOEQUALS".into()], host).is_err());
    }

    #[test]
    fn users_resolve_by_name_or_number() {
        let pw = "root:x:0:0::/root:/bin/sh\napp:x:1001:1002::/home/app:/bin/sh\n";
        let gr = "root:x:0:\nstaff:x:50:\n";
        assert_eq!(resolve_user("", pw, gr).unwrap(), None);
        assert_eq!(resolve_user("app", pw, gr).unwrap(), Some((1001, 1002)));
        assert_eq!(resolve_user("1001", pw, gr).unwrap(), Some((1001, 1002)));
        assert_eq!(resolve_user("4000", pw, gr).unwrap(), Some((4000, 4000)));
        assert_eq!(resolve_user("app:staff", pw, gr).unwrap(), Some((1001, 50)));
        assert_eq!(resolve_user("0:7", pw, gr).unwrap(), Some((0, 7)));
        assert!(resolve_user("nobody", pw, gr).is_err());
        assert!(resolve_user("app:nogroup", pw, gr).is_err());
    }
}
