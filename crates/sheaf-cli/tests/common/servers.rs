//! Real servers on loopback for the HTTP tests, each a child process killed
//! on drop: [`Nginx`] (a static file server with Range support), [`Squid`]
//! (a caching forward proxy) and [`FaultProxy`] (a proxy that corrupts,
//! truncates, fails, slows or hangs on demand: tests/support/faultproxy.py).

use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that was free a moment ago on 127.0.0.1.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The last `n` lines of a (log) file, or a note that it cannot be read.
pub fn tail(p: &Path, n: usize) -> String {
    match fs::read(p) {
        Ok(b) => {
            let s = String::from_utf8_lossy(&b);
            let lines: Vec<&str> = s.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        }
        Err(e) => format!("({}: {e})", p.display()),
    }
}

/// Path of program `name`: from PATH, else /usr/sbin or /sbin (not in a
/// non-root user's PATH on Debian, where nginx and squid are).
pub fn program(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| PathBuf::from(name))
}

/// Wait until 127.0.0.1:`port` accepts connections; panic (with `log`'s tail)
/// if `child` exits first or `timeout` passes.
fn wait_port(child: &mut Child, port: u16, what: &str, log: &Path, timeout: Duration) {
    let t0 = Instant::now();
    loop {
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return;
        }
        if let Ok(Some(st)) = child.try_wait() {
            panic!(
                "{what} exited ({st}) before listening on port {port}; {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        if t0.elapsed() > timeout {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "{what} did not listen on port {port} within {timeout:?}; {}:\n{}",
                log.display(),
                tail(log, 30)
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One HTTP/1.1 GET of `path` on 127.0.0.1:`port`: (status, body).
pub fn http_get(port: u16, path: &str) -> (u16, String) {
    let mut s = TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf)
        .unwrap_or_else(|e| panic!("GET {path} on port {port}: {e}"));
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("GET {path} on port {port}: bad answer {text:?}"));
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// nginx serving a directory on 127.0.0.1 (`daemon off; master_process off`).
pub struct Nginx {
    child: Child,
    pub port: u16,
    /// The directory served.
    pub www: PathBuf,
    /// nginx's error log.
    pub log: PathBuf,
    scheme: &'static str,
}

impl Nginx {
    /// Serve `dir/www` (created); config and temporaries go in `dir`.
    pub fn start(dir: &Path) -> Nginx {
        Nginx::start_with_root(dir, &dir.join("www"))
    }

    /// Serve `www` (created if missing); config and temporaries go in `dir`
    /// under names with the port in them, so several nginx (e.g. a mirror of
    /// the same `www`) can share one `dir`.
    pub fn start_with_root(dir: &Path, www: &Path) -> Nginx {
        Nginx::start_inner(dir, www, None)
    }

    /// Serve `www` over HTTPS with this certificate chain and key (PEM);
    /// `url()` and `base()` then give `https://` URLs.
    pub fn start_tls(dir: &Path, www: &Path, cert: &Path, key: &Path) -> Nginx {
        Nginx::start_inner(dir, www, Some((cert, key)))
    }

    fn start_inner(dir: &Path, www: &Path, tls: Option<(&Path, &Path)>) -> Nginx {
        let port = free_port();
        let tmp = dir.join(format!("nginx-{port}-tmp"));
        fs::create_dir_all(www).unwrap();
        fs::create_dir_all(&tmp).unwrap();
        let www = www.canonicalize().unwrap();
        let t = tmp.display();
        let log = tmp.join("error.log");
        let conf = dir.join(format!("nginx-{port}.conf"));
        fs::write(
            &conf,
            format!(
                "daemon off;\nmaster_process off;\npid {t}/nginx.pid;\nerror_log {t}/error.log;\n\
                 events {{ worker_connections 256; }}\n\
                 http {{ access_log off; client_body_temp_path {t}; proxy_temp_path {t};\n\
                 fastcgi_temp_path {t}; uwsgi_temp_path {t}; scgi_temp_path {t};\n\
                 server {{ listen 127.0.0.1:{port}{}; root {}; {} }} }}\n",
                if tls.is_some() { " ssl" } else { "" },
                www.display(),
                tls.map(|(c, k)| format!(
                    "ssl_certificate {}; ssl_certificate_key {};",
                    c.display(),
                    k.display()
                ))
                .unwrap_or_default()
            ),
        )
        .unwrap();
        let mut child = Command::new(program("nginx"))
            .arg("-e")
            .arg(&log)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .spawn()
            .expect("nginx (apt-get install nginx-light)");
        wait_port(&mut child, port, "nginx", &log, Duration::from_secs(10));
        Nginx {
            child,
            port,
            www,
            log,
            scheme: if tls.is_some() { "https" } else { "http" },
        }
    }

    /// URL of `name` (relative to `www`).
    pub fn url(&self, name: &str) -> String {
        format!("{}/{}", self.base(), name.trim_start_matches('/'))
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn base(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme, self.port)
    }

    /// Kill the server (it refuses connections from then on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A real squid as a caching forward proxy on 127.0.0.1 (`proxy_url()`),
/// with its config, cache_dir (ufs), logs and pid file in its own directory.
/// Whole responses are cached (up to 64 MB); Range requests for an object
/// not in the cache are forwarded as they are and not cached (squid's
/// default `range_offset_limit 0`); a Range request for a cached object is
/// served from the cache.
pub struct Squid {
    child: Child,
    pub port: u16,
    /// Where its config, cache, logs and pid file are.
    pub dir: PathBuf,
    /// Service name (`squid -n`), which also names its /dev/shm segments.
    name: String,
}

impl Squid {
    /// Start squid with its files in `dir/squid-PORT`; returns once it accepts
    /// connections. Runs as `proxy` (or `nobody`) when started as root: squid
    /// refuses to run as root, so then the directory is chowned to that user and
    /// `dir`'s ancestors are made traversable (o+x) where they are not.
    pub fn start(dir: &Path) -> Squid {
        let port = free_port();
        let name = format!("sheafsq{port}");
        let sd = dir.join(format!("squid-{port}"));
        fs::create_dir_all(sd.join("cache")).unwrap();
        let sd = sd.canonicalize().unwrap();
        let d = sd.display();
        let user = if unsafe { libc::geteuid() } == 0 {
            let (user, uid, gid) = ["proxy", "nobody"]
                .iter()
                .find_map(|u| user_ids(u).map(|(uid, gid)| (*u, uid, gid)))
                .expect("squid runs as root only with a user `proxy` or `nobody` to switch to");
            for e in walk_all(&sd) {
                super::lchown(&e, uid, gid);
            }
            for a in sd.ancestors().skip(1) {
                let m = fs::metadata(a).unwrap().mode();
                if m & 0o001 == 0 {
                    fs::set_permissions(a, fs::Permissions::from_mode((m & 0o7777) | 0o001))
                        .unwrap();
                }
            }
            format!("cache_effective_user {user}\n")
        } else {
            String::new()
        };
        // Gotchas: `-n NAME` (unique per instance) names squid's /dev/shm
        // segments, which would otherwise clash between instances and with a
        // system squid; `visible_hostname` spares a hostname lookup that can be
        // fatal; `cache_dir ... 4 16` makes 64 directories in `squid -z` where
        // the usual 16 256 makes 4096 (seconds on a busy disk); the default
        // config is never read (`-f`); the ACL is not named `localhost`, which
        // squid predefines.
        let conf = sd.join("squid.conf");
        fs::write(
            &conf,
            format!(
                "# Written by the sheaf tests (tests/common/servers.rs).\n\
                 http_port 127.0.0.1:{port}\n\
                 {user}\
                 visible_hostname sheaf-test-squid\n\
                 pid_filename {d}/squid.pid\n\
                 cache_log {d}/cache.log\n\
                 access_log stdio:{d}/access.log squid\n\
                 cache_store_log none\n\
                 logfile_rotate 0\n\
                 coredump_dir {d}\n\
                 cache_dir ufs {d}/cache 100 4 16\n\
                 cache_mem 64 MB\n\
                 maximum_object_size 64 MB\n\
                 maximum_object_size_in_memory 16 MB\n\
                 refresh_pattern . 1440 100% 10080\n\
                 pinger_enable off\n\
                 shutdown_lifetime 1 seconds\n\
                 client_db off\n\
                 acl sheaf_clients src 127.0.0.1/32\n\
                 http_access allow sheaf_clients\n\
                 http_access deny all\n"
            ),
        )
        .unwrap();
        let log = sd.join("cache.log");
        let out = sd.join("squid.out");
        let squid = |args: &[&str]| {
            let o = fs::File::create(&out).unwrap();
            let mut c = Command::new(program("squid"));
            c.arg("-n")
                .arg(&name)
                .args(args)
                .arg("-N")
                .arg("-f")
                .arg(&conf)
                .current_dir(&sd)
                .stdin(Stdio::null())
                .stdout(o.try_clone().unwrap())
                .stderr(o);
            c
        };
        // Create the cache directories (in the foreground: -N).
        let st = squid(&["-z"])
            .status()
            .expect("squid (apt-get install squid)");
        assert!(
            st.success(),
            "squid -z failed ({st}); {}:\n{}\n{}",
            log.display(),
            tail(&log, 30),
            tail(&out, 10)
        );
        let mut child = squid(&[]).spawn().expect("squid");
        wait_port(&mut child, port, "squid", &log, Duration::from_secs(30));
        Squid {
            child,
            port,
            dir: sd,
            name,
        }
    }

    /// `http://127.0.0.1:PORT`, for `http_proxy` or `curl -x`.
    pub fn proxy_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The access log so far (one line per finished request).
    pub fn access_log(&self) -> String {
        fs::read_to_string(self.dir.join("access.log")).unwrap_or_default()
    }

    /// (served from the cache, forwarded to the origin) over the requests
    /// logged so far: TCP_HIT, TCP_MEM_HIT, TCP_REFRESH_UNMODIFIED and other
    /// *_HIT codes vs TCP_MISS, TCP_REFRESH_MODIFIED and other *_MISS codes.
    /// Denied or aborted-before-forwarding requests count as neither.
    pub fn hits(&self) -> (u64, u64) {
        let (mut hits, mut misses) = (0, 0);
        for l in self.access_log().lines() {
            let Some(code) = l.split_whitespace().nth(3) else {
                continue;
            };
            let tag = code.split('/').next().unwrap_or("");
            if tag.contains("HIT") || tag == "TCP_REFRESH_UNMODIFIED" {
                hits += 1;
            } else if tag.contains("MISS") || tag.starts_with("TCP_REFRESH") {
                misses += 1;
            }
        }
        (hits, misses)
    }

    /// [`hits`](Self::hits) once at least `n` requests are counted (squid
    /// logs a request just after answering it); panics after 10 s.
    pub fn wait_hits(&self, n: u64) -> (u64, u64) {
        let t0 = Instant::now();
        loop {
            let (h, m) = self.hits();
            if h + m >= n {
                return (h, m);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "squid logged {h} hits + {m} misses, waited for {n}:\n{}",
                self.access_log()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Kill squid now (it refuses connections from then on).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // SIGKILL leaves squid's shared memory segments behind.
        if let Ok(rd) = fs::read_dir("/dev/shm") {
            let prefix = format!("{}-", self.name);
            for e in rd.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
}

impl Drop for Squid {
    fn drop(&mut self) {
        self.stop();
    }
}

/// (uid, gid) of a user in the password database.
fn user_ids(name: &str) -> Option<(u32, u32)> {
    let c = std::ffi::CString::new(name).unwrap();
    let pw = unsafe { libc::getpwnam(c.as_ptr()) };
    if pw.is_null() {
        None
    } else {
        Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
    }
}

/// `root` and everything under it.
fn walk_all(root: &Path) -> Vec<PathBuf> {
    let mut out = vec![root.to_path_buf()];
    let mut i = 0;
    while i < out.len() {
        if fs::symlink_metadata(&out[i]).unwrap().is_dir() {
            let mut more: Vec<PathBuf> = fs::read_dir(&out[i])
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            out.append(&mut more);
        }
        i += 1;
    }
    out
}

/// tests/support/faultproxy.py on 127.0.0.1: a reverse proxy to an upstream
/// base URL (`url(name)`), and a forward proxy for absolute-URL requests
/// (`base()` as `http_proxy`), that misbehaves as its mode says: `pass`,
/// `corrupt`, `truncate`, `status=N`, `throttle=BYTES_PER_SEC`, `delay=MS`,
/// `hang`, combinable with commas (see the script's doc).
pub struct FaultProxy {
    child: Child,
    pub port: u16,
    pub upstream: String,
    _stdout: BufReader<ChildStdout>,
}

impl FaultProxy {
    /// Path of the script.
    pub fn script() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/support/faultproxy.py")
    }

    /// Proxy to `upstream_base` (e.g. `nginx.base()`; `""` for a forward
    /// proxy only) in `mode`; returns once it listens.
    pub fn start(upstream_base: &str, mode: &str) -> FaultProxy {
        let up = if upstream_base.is_empty() {
            "-"
        } else {
            upstream_base
        };
        let mut child = Command::new("python3")
            .arg(Self::script())
            .arg(up)
            .arg(mode)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        let _ = stdout.read_line(&mut line);
        let port = match line.trim().parse::<u16>() {
            Ok(p) => p,
            Err(_) => {
                let _ = child.kill();
                let st = child.wait();
                panic!("faultproxy.py {up} {mode} did not start ({st:?}); first line: {line:?}")
            }
        };
        FaultProxy {
            child,
            port,
            upstream: upstream_base.to_string(),
            _stdout: stdout,
        }
    }

    /// `http://127.0.0.1:PORT` (no trailing slash); also the URL to use
    /// as `http_proxy`.
    pub fn base(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// URL on the proxy for upstream's `name`.
    pub fn url(&self, name: &str) -> String {
        format!("{}/{}", self.base(), name.trim_start_matches('/'))
    }

    /// Change the mode from now on (requests being answered keep theirs).
    #[track_caller]
    pub fn set_mode(&self, mode: &str) {
        let (st, body) = http_get(self.port, &format!("/__mode/{mode}"));
        assert_eq!(st, 200, "faultproxy: set mode {mode:?}: {body}");
    }

    /// The current mode.
    pub fn mode(&self) -> String {
        http_get(self.port, "/__mode").1.trim().to_string()
    }

    /// Requests received so far (proxied or faulted; control URLs excluded).
    pub fn count(&self) -> u64 {
        let (st, body) = http_get(self.port, "/__count");
        assert_eq!(st, 200, "faultproxy /__count: {body}");
        body.trim()
            .parse()
            .unwrap_or_else(|_| panic!("faultproxy /__count: {body:?}"))
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}
